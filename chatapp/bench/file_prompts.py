"""The code-edit prompts with their code attached as a file: the category "code-edit-file".

A "code-edit" prompt is an instruction, a blank line, then the code in one fenced block. Its file
variant (id ``<id>-file``) sends the same code the way ``specchat run --file`` does: the code is
written to a file in a temporary folder (named after the prompt, with the extension of the
fence's language: ``edit_rename.py``), read back by ``read_attachment`` and put in the message by
``message_text``, so the bench runs the app's own attachment path (the file first, fenced with
its language and path, then the instruction). The instruction's closing colon, which pointed at
the code below it, becomes a full stop. A code-edit prompt laid out otherwise has no file
variant.

The variants are not part of the default prompt set (they would count the code edits twice):
``select_prompts`` offers them when their id or category is named, each right after its prompt,
so that an auto policy kept across prompts has learnt as much before either.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from chatapp.chat.attachments import LANGUAGES, message_text, read_attachment

if TYPE_CHECKING:
    from chatapp.bench.specs import BenchPrompt

SOURCE_CATEGORY = "code-edit"
FILE_CATEGORY = "code-edit-file"
FILE_SUFFIX = "-file"  # a variant's id: its prompt's id and this
PASTED = re.compile(r"(?P<instruction>\S.*?)\n\n(?P<fence>`{3,})(?P<language>[\w+-]*)\n"
                    r"(?P<code>.*\n)(?P=fence)\s*", re.DOTALL)


def file_name(prompt_id: str, language: str) -> str:
    """The file a variant attaches: the prompt's id as a Python-style name, with the first
    extension ``language_of`` reads as ``language`` (none when no extension does)."""
    extension = next((ext for ext, name in LANGUAGES.items() if name == language), "")
    stem = prompt_id.replace("-", "_")
    return f"{stem}.{extension}" if extension else stem


def file_variants(prompts: Sequence[BenchPrompt]) -> list[BenchPrompt]:
    """The file variant of every "code-edit" prompt of ``prompts`` that pastes its code as an
    instruction then one fenced block, in order."""
    pasted = [(prompt, match) for prompt in prompts if prompt.category == SOURCE_CATEGORY
              and (match := PASTED.fullmatch(prompt.text)) is not None]
    if not pasted:
        return []
    variants = []
    with tempfile.TemporaryDirectory(prefix="specchat-bench-") as folder:
        for prompt, match in pasted:
            name = file_name(prompt.id, match["language"])
            (Path(folder) / name).write_bytes(match["code"].encode("utf-8"))
            attachment = read_attachment(name, Path(folder))
            instruction = re.sub(r":\s*$", ".", match["instruction"].strip())
            variants.append(dataclasses.replace(
                prompt, id=prompt.id + FILE_SUFFIX, category=FILE_CATEGORY,
                text=message_text(instruction, [attachment])))
    return variants


def with_file_variants(prompts: Sequence[BenchPrompt]) -> list[BenchPrompt]:
    """``prompts``, each followed by its file variant if it has one."""
    variants = {variant.id.removesuffix(FILE_SUFFIX): variant
                for variant in file_variants(prompts)}
    return [each for prompt in prompts
            for each in (prompt, variants.get(prompt.id)) if each is not None]
