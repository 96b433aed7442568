"""The models people already have: GGUF files other tools keep (Ollama, LM Studio, the Hugging
Face cache, llama.cpp's cache, the config's ``model_dirs``), found read-only and offline
(``stores``); what their GGUF headers say, vocabulary fingerprint included (``gguf_facts``);
which can draft for which (``pairing``); and the one network command, ``specchat models pull``
(``pull``)."""
