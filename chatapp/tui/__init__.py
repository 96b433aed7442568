"""The chat app (Textual). It consumes the engine's event stream only; it never calls a model."""
