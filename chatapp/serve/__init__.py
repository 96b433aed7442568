"""`specchat serve`: the speculative engine behind an OpenAI-compatible chat-completions API.

Modules, one concern each: ``schemas`` (the request bodies, validated with pydantic),
``errors`` (OpenAI-shaped refusals), ``responses`` (the completion, chunk and usage objects),
``worker`` (one generation at a time on the models' thread, a bounded queue before it),
``metrics`` (Prometheus), ``guard`` (Host, Origin and API-key checks), ``app`` (the routes) and
``command`` (options, start, signals, stop). The server calls the conversation layer
(``chatapp.api.exchange``) only: never a model, a drafter, a policy or a backend.
"""
