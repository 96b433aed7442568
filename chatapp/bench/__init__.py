"""`specchat bench`: speculative decoding against plain target decoding, on one machine.

Every configuration decodes the prompts of ``chatapp/data/bench_prompts.json`` through the app's own
engine (``SpeculativeEngine.generate``) with the app's own loader pieces (``load_backend``,
``make_drafter``, ``make_policy``, ``generation_settings``): there is no second decoding loop.
The configurations: target-only decoding, the draft model at K = 1..8 and auto, the n-gram
drafter (auto) and n-gram + model (auto). Runs are interleaved per prompt (each prompt through
every configuration, one after the other, so that machine noise hits them alike; the order
rotates from prompt to prompt, so that no configuration always runs first or last) with the same
seed, and both KV caches are emptied before every run (each pays its own prompt, as on the first
turn of a chat; a draft model is only fed once asked to draft).

Speed is generation speed: emitted tokens / (turn time - prompt time). The prompt time is the
target's prefill, the same in every configuration; everything a draft model costs (its own prefill
included) counts. The ratio is against the target-only run of the same prompt and round; the
summary gives the geometric mean over prompts (its median over rounds) and the worst prompt.
``same`` is how many tokens match the target-only output before the first difference (llama.cpp's
batched arithmetic differs slightly from its one-token arithmetic, so greedy outputs may drift
apart after a while).

A short warm-up run of every configuration comes first (it loads pages and caches). With the
transformers backend, transformers' own assisted generation (``num_assistant_tokens=4``) is run
as a reference row.

``repeats`` N runs every prompt in N rounds, each round every configuration once (the order
rotated from round to round), and reports each ratio to target-only paired within a round, with its
median and range over the rounds (``rounds``): a result, not a sample. An adaptive configuration
starts every run from a new policy, from the memory the app keeps for its setup, or both, as two
rows (``policy_memory``; the JSON says which, and what the memory held, and the verification
costs each adaptive configuration was calibrated with, ``calibrations``).
The command-line flags that choose prompts and configurations are in ``chatapp.cli``.

The package: ``specs`` (prompts and configurations), ``file_prompts`` (the code edits with their
code attached as a file, the category "code-edit-file"), ``policy_memory`` (what an adaptive
policy starts from), ``runner`` (the interleaved runs through the engine), ``rounds`` (ratios
paired within a round, medians and ranges), ``report`` (rows, summaries and the table),
``hf_reference`` (transformers' assisted
generation), ``command`` (``bench_command``, what ``specchat bench`` calls), ``conversation`` (the
multi-turn editing conversation, ``--conversation``), ``llama_cpp_compare`` (llama.cpp's own tools
beside specchat, ``--against-llama-cpp``).
"""

from chatapp.bench.command import bench_command, bench_max_tokens
from chatapp.bench.policy_memory import MEMORY_CHOICES, PolicyMemory
from chatapp.bench.rounds import geometric_mean
from chatapp.bench.runner import BenchBackends, rotated
from chatapp.bench.specs import (
                                 PROMPTS_PATH,
                                 BenchPrompt,
                                 RunSpec,
                                 default_specs,
                                 load_prompts,
                                 select_prompts,
)

__all__ = ["MEMORY_CHOICES", "PROMPTS_PATH", "BenchBackends", "BenchPrompt", "PolicyMemory",
           "RunSpec", "bench_command", "bench_max_tokens", "default_specs", "geometric_mean",
           "load_prompts", "rotated", "select_prompts"]
