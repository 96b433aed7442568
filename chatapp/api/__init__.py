"""The API's exchange: one stateless request at a time over the loaded pair (``exchange``), its
stop sequences (``stops``) and what the server keeps of what it served (``served``), replying
through the chat layer's one pipeline (``chatapp.chat.session.ChatSession.reply``)."""
