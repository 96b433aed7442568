"""Grammars over a model's vocabulary, through llguidance: the engine's ``TokenConstraint`` for a
reply that must match a grammar (a JSON schema, a forced tool call).

``Grammars(backend)`` compiles grammars in llguidance's Lark dialect for one backend's vocabulary
(``chatapp.grammar.vocabulary``: the tokenizer built once, on first use) into
``GrammarConstraint``s (``chatapp.grammar.matcher``); a grammar llguidance cannot compile raises
``GrammarError``.
"""
