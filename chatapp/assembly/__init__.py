"""The composition root: the only code that knows concrete backends and drafters. ``loader``
builds a ready ``ChatSession`` from the settings; ``models`` is `specchat models`' report."""
