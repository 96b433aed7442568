"""Command line: `specchat` (the chat app), `specchat web` (the app in a browser tab),
`specchat serve` (an OpenAI-compatible API), `specchat run`, `specchat bench`, `specchat models`,
`specchat rpc-server` (this machine's CPU or GPU for another machine's target, see the README).

Every user mistake (bad option, unknown model, broken config, incompatible pair) ends in one
readable line on stderr and exit status 1 or 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chatapp.chats_command import add_chats_parser, chats_command
from chatapp.errors import UserFacingError
from chatapp.offline import stay_offline
from chatapp.settings.config import Config, command_line_settings, load_config
from chatapp.settings.options import (
    DEFAULT_RPC_PORT,
    OPTIONS,
    Rule,
    arg_type,
    at_least,
    endpoint_list,
)

SUBCOMMANDS = ("run", "bench", "models", "tui", "web", "serve", "chats", "rpc-server")

_positive_int = arg_type(int, at_least(1), "positive_int")
_non_negative_int = arg_type(int, at_least(0), "non_negative_int")
_weight = arg_type(float, at_least(0), "weight")
_port = arg_type(int, Rule("1..65535", lambda port: 1 <= port <= 65535), "port")


def _option(name: str) -> dict[str, Any]:
    """argparse's ``type`` (or ``choices``) for the setting ``name``, from
    ``chatapp.settings.options``."""
    option = OPTIONS[name]
    return {"choices": option.choices} if option.choices else {"type": option.arg_type()}


def _allowed(name: str) -> str:
    """What the setting ``name`` allows, as its rule says ("0..16 or auto")."""
    rule = OPTIONS[name].rule
    return rule.text if rule is not None else ""


def _bench_configs(text: str) -> list[Any]:
    from chatapp.bench import RunSpec

    try:
        return [RunSpec.parse(part) for part in text.split(",") if part.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _k_values(text: str) -> list[int]:
    values = [_positive_int(part) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError("give at least one K, e.g. 1,2,4")
    return values


def _model_options() -> argparse.ArgumentParser:
    """Options shared by the chat app, run and bench; absent ones leave the config untouched."""
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    common.add_argument("--config", type=Path, help="config file (default: the user config dir)")
    common.add_argument("--preset", help="a preset of the config file (built in: code, chat)")
    common.add_argument("--draft", help="draft model: catalog alias, path, a name `specchat "
                        "models` lists (ollama:..., lmstudio:..., hf:...) or auto (the best "
                        "local draft for the target; the default for such a target)")
    common.add_argument("--target", help="target model: catalog alias, path or a name `specchat "
                        "models` lists (ollama:NAME:TAG, lmstudio:..., hf:ORG/REPO/FILE)")
    common.add_argument("--backend", **_option("backend"),
                        help="llama (GGUF, llama.cpp) or hf (PyTorch)")
    common.add_argument("--draft-backend", **_option("draft_backend"),
                        help="the draft model's backend (default: same as the target's)")
    common.add_argument("--drafter", **_option("drafter"), help="who proposes draft tokens")
    common.add_argument("-k", "--draft-length", **_option("draft_length"),
                        help=f"draft tokens per step, {_allowed('draft_length')} (0: no draft)")
    common.add_argument("--temperature", **_option("temperature"), help="0 = greedy")
    common.add_argument("--top-k", **_option("top_k"), help="0 = off")
    common.add_argument("--top-p", **_option("top_p"), help="nucleus mass in (0, 1]; 1 = off")
    common.add_argument("--min-p", **_option("min_p"),
                        help="keep tokens at least this times as likely as the best; 0 = off")
    common.add_argument("--seed", **_option("seed"),
                        help="random seed (default: a new one per start)")
    common.add_argument("--max-tokens", **_option("max_tokens"), help="longest reply, in tokens")
    common.add_argument("--system", dest="system_prompt", help="system prompt")
    common.add_argument("--n-ctx", **_option("n_ctx"), help="context window, in tokens, or auto "
                        "(the default: the model's trained context as far as memory allows)")
    common.add_argument("--overflow", **_option("overflow"), help="a message that would not fit "
                        "the context: leave the oldest turns out of the model's view "
                        "(drop-oldest, the default) or refuse to send it")
    common.add_argument("--threads", **_option("threads"), help="CPU threads")
    common.add_argument("--gpu-layers", **_option("gpu_layers"),
                        help="layers offloaded to the GPU (llama backend)")
    common.add_argument("--device", **_option("device"), help="auto, cpu or cuda (hf backend)")
    common.add_argument("--dtype", **_option("dtype"), help="weights dtype (hf backend)")
    common.add_argument("--layout", **_option("layout"), help="weight layout of the catalog "
                        "models on llama.cpp: auto (fastest faithful on this CPU), shipped, fast")
    common.add_argument("--rpc", type=_endpoints, help="the target's layers on these RPC "
                        "servers (`specchat rpc-server` there), comma-separated host:port; the "
                        "draft stays here")
    common.add_argument("--tensor-split", type=_weights, help="share of the target's layers per "
                        "RPC device, comma-separated, e.g. 3,1 (default: by free memory)")
    return common


def _endpoints(text: str) -> tuple[str, ...]:
    try:
        return endpoint_list(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _weights(text: str) -> tuple[float, ...]:
    return tuple(_weight(part) for part in text.split(",") if part.strip())


def build_parser() -> argparse.ArgumentParser:
    common = _model_options()
    parser = argparse.ArgumentParser(
        prog="specchat", parents=[common],
        description="Local, offline chat on speculative decoding. With no command: the chat app.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("tui", parents=[common], help="the chat app (the default)")
    web = commands.add_parser("web", parents=[common], help="the chat app in a browser tab, "
                              "served on 127.0.0.1 only")
    web.add_argument("--port", type=_port_or_free, default=0,
                     help="port (default 0: a free one)")
    web.add_argument("--no-open", dest="open", action="store_false",
                     help="print the address, do not open the browser")
    _add_serve_parser(commands, common)
    run = commands.add_parser("run", parents=[common], help="answer one prompt on stdout")
    run.add_argument("prompt", help="the prompt; - reads it from stdin")
    run.add_argument("--json", action="store_true", help="one JSON event per line on stdout")
    run.add_argument("--file", dest="files", action="append", default=[], metavar="PATH",
                     help="attach this text file to the prompt (repeatable)")
    _add_models_parser(commands, common)
    _add_bench_parser(commands, common)
    _add_rpc_server_parser(commands)
    add_chats_parser(commands)
    return parser


def _add_models_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    """``specchat models`` (offline) and ``specchat models pull`` (the hub)."""
    models = commands.add_parser("models", parents=[common], help="list the catalog and the "
                                 "models other tools keep here (Ollama, LM Studio, the Hugging "
                                 "Face cache), with the drafts that fit each")
    models.add_argument("--json", dest="as_json", action="store_true",
                        help="one JSON object on stdout, for scripts")
    actions = models.add_subparsers(dest="models_action", metavar="ACTION")
    pull = actions.add_parser("pull", help="download a GGUF model from the Hugging Face hub into "
                              "its cache (the only command that uses the network)")
    pull.add_argument("repo", metavar="REPO[:QUANT]", help="e.g. "
                      "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q4_K_M (default quantisation: "
                      "Q4_K_M, or the only GGUF file)")


def _pulls(args: argparse.Namespace) -> bool:
    """Whether the command is ``specchat models pull`` (the one that may use the network)."""
    return getattr(args, "models_action", None) == "pull"


def _add_bench_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    """``specchat bench`` and its options."""
    bench = commands.add_parser("bench", parents=[common], help="measure speculative vs plain")
    bench.add_argument("--json", dest="json_path", type=Path, help="also write results here")
    bench.add_argument("--prompts", help="a count (the first N), or comma-separated prompt ids "
                       "or categories (code-write, code-edit, prose, qa; code-edit-file: the code "
                       "edits attached as by run --file); default: all but code-edit-file")
    bench.add_argument("--prompt-file", type=Path, help="another prompt set, same JSON layout as "
                       "chatapp/data/bench_prompts.json")
    bench.add_argument("--configs", type=_bench_configs, help="comma-separated: target, "
                       "model:K, model:auto, ngram:K, ngram:auto, ngram+model:auto (a drafter name "
                       "ending in -noedit: without speculative edits), each optionally with @N "
                       "(N CPU threads) or @auto (default: target, K=1..8, auto, ngram auto, "
                       "ngram+model auto)")
    bench.add_argument("--k-values", type=_k_values, help="K values of the default set, e.g. 1,2,4")
    bench.add_argument("--repeats", type=_positive_int, default=1, help="run each prompt in N "
                       "rounds, each configuration once a round in a rotating order, and report "
                       "the median and range over the rounds of each ratio to target-only "
                       "(paired within a round)")
    bench.add_argument("--busy", type=_non_negative_int, default=0, help="run N CPU-bound "
                       "processes beside the bench (a busy machine), stopped when it ends")
    bench.add_argument("--no-warmup", dest="warmup", action="store_false",
                       help="skip the short warm-up run of every configuration")
    bench.add_argument("--baseline", metavar="PYTHON", help="another installation's Python "
                       "(e.g. another venv's bin/python): its target-only run of each prompt "
                       "goes just before this bench's, and every configuration is also "
                       "compared with it")
    bench.add_argument("--policy-memory", choices=("fresh", "learnt", "both"), default="fresh",
                       help="what each auto configuration's policy starts every run from: "
                       "nothing (fresh, the first reply of a new install; the default), the "
                       "memory the app keeps for its setup (learnt, the first reply after a "
                       "restart), or both, as two rows")
    mode = bench.add_mutually_exclusive_group()
    mode.add_argument("--conversation", action="store_true", help="run the scripted "
                      "multi-turn editing conversation as one chat instead of the prompts")
    mode.add_argument("--against-llama-cpp", type=Path, metavar="DIR", help="also run llama.cpp's "
                      "llama-bench and llama-speculative-simple from DIR on the same prompts and "
                      "print one comparison table")
    mode.add_argument("--verify-costs", action="store_true", help="time the target verifying "
                      "n = 1..32, 48 and 64 tokens after the first chosen prompt (the cost curve "
                      "the auto policy learns), and the most a fully accepted step could gain")
    mode.add_argument("--fidelity", metavar="CANDIDATE", help="how close a layout of the "
                      "target keeps to the reference (--fidelity-reference) on the prompts: "
                      "shipped, q8_0, q4_0 or a GGUF path, optionally followed by /noamx")
    bench.add_argument("--fidelity-reference", metavar="REFERENCE", default="shipped",
                       help="the reference of --fidelity (default: shipped)")


def model_argv(args: argparse.Namespace) -> list[str]:
    """The model options given on this command line, as arguments again (for `web`'s app)."""
    given = vars(args)
    return [f"{max(action.option_strings, key=len)}={given[action.dest]}"
            for action in _model_options()._actions
            if action.option_strings and action.dest in given]


def _add_serve_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    serve = commands.add_parser("serve", parents=[common], help="serve the models over an "
                                "OpenAI-compatible API (chat completions), on 127.0.0.1 by "
                                "default")
    serve.add_argument("--host", default="127.0.0.1", help="IP address to listen on (default "
                       "127.0.0.1; any other needs an API key)")
    serve.add_argument("--port", type=_port_or_free, default=8000,
                       help="TCP port (default 8000; 0: a free one)")
    serve.add_argument("--api-key", help="the key clients must send (Authorization: Bearer "
                       "KEY); better given as SPECCHAT_API_KEY, which the process list does "
                       "not show")
    serve.add_argument("--cors", action="append", default=[], metavar="ORIGIN",
                       help="let web pages of ORIGIN (e.g. http://localhost:3000) call the API; "
                       "repeatable")
    serve.add_argument("--queue", type=_non_negative_int, default=4, help="requests that may "
                       "wait while one reply is made (default 4; more get 429)")
    serve.add_argument("--save", action="store_true", help="write the requests and replies to "
                       "the chat history, and index it for drafting across restarts")
    serve.add_argument("--served-model-name", action="append", default=[], metavar="NAME",
                       help="list NAME among the models (e.g. gpt-4o-mini, for a client that "
                       "keys features on the name); repeatable. Any name is served.")


_port_or_free = arg_type(int, Rule("0..65535", lambda port: 0 <= port <= 65535), "port")


def _add_rpc_server_parser(commands: Any) -> None:
    server = commands.add_parser("rpc-server", help="serve this machine's CPU or GPU to the "
                                 "target of a specchat on another machine (trusted networks only)")
    server.add_argument("--host", default="127.0.0.1", help="IPv4 address to listen on "
                        "(default 127.0.0.1; another one needs --unauthenticated-network)")
    server.add_argument("--unauthenticated-network", action="store_true",
                        help="listen on an address other than loopback although the RPC "
                        "protocol has no authentication and no encryption (trusted networks "
                        "only)")
    server.add_argument("--port", type=_port, default=DEFAULT_RPC_PORT,
                        help=f"TCP port (default {DEFAULT_RPC_PORT})")
    server.add_argument("--threads", dest="server_threads", type=_positive_int,
                        help="CPU threads (default: every CPU this process may use)")
    server.add_argument("--device", dest="server_devices", type=_names, default=[],
                        help="devices to serve, comma-separated, e.g. CUDA0 or CPU (default: the "
                        "accelerators, else the CPU)")


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def rpc_server_command(args: argparse.Namespace) -> int:
    """`specchat rpc-server`: ggml's RPC server loop, in the foreground until killed (Ctrl-C)."""
    from chatapp.backends.rpc import serve_command

    return serve_command(args.host, args.port, args.server_threads, args.server_devices,
                         args.unauthenticated_network)


def load_settings(args: argparse.Namespace) -> Config:
    """The config file with the command line's preset and options over it."""
    config = load_config(vars(args).get("config"))
    return config.with_overrides(**command_line_settings(config, vars(args)))


def bench(config: Config, args: argparse.Namespace) -> int:
    """`specchat bench` with the prompts and configurations its flags choose; an ``auto`` draft
    is chosen first, as the app chooses it (a note on stderr says which)."""
    from chatapp.assembly.local_models import choose_draft
    from chatapp.bench import (
        MEMORY_CHOICES,
        PROMPTS_PATH,
        bench_command,
        bench_max_tokens,
        default_specs,
        load_prompts,
        select_prompts,
    )

    try:
        prompts = select_prompts(load_prompts(args.prompt_file or PROMPTS_PATH), args.prompts)
    except (OSError, ValueError, KeyError) as error:
        print(f"specchat bench: cannot use those prompts: {error}", file=sys.stderr)
        return 2
    config, note = choose_draft(config)
    if note:
        print(f"note: {note}", file=sys.stderr)
    specs = args.configs or (default_specs(args.k_values) if args.k_values else None)
    if args.against_llama_cpp is not None:
        from chatapp.bench.llama_cpp_compare import compare_command

        return compare_command(config, args.against_llama_cpp, prompts, specs,
                               bench_max_tokens(config), warmup=args.warmup, repeats=args.repeats)
    if args.fidelity is not None:
        from chatapp.bench.fidelity import DEFAULT_REPLY_TOKENS, fidelity_command

        tokens = config.max_tokens if config.max_tokens != Config().max_tokens else (
            DEFAULT_REPLY_TOKENS)
        return fidelity_command(config, args.fidelity, args.fidelity_reference, prompts, tokens,
                                args.json_path)
    if args.verify_costs:
        from chatapp.bench.verify_costs import verify_costs_command

        return verify_costs_command(config, prompts[0])
    if args.conversation:
        from chatapp.bench.conversation import conversation_command

        return conversation_command(config, specs or default_specs(), bench_max_tokens(config),
                                    args.json_path, warmup=args.warmup)
    return bench_command(config, args.json_path, prompts=prompts, specs=specs,
                         warmup=args.warmup, memories=MEMORY_CHOICES[args.policy_memory],
                         repeats=args.repeats, busy=args.busy,
                         baseline=args.baseline.split() if args.baseline else None)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not _pulls(args):
        stay_offline()
    try:
        command = args.command or "tui"
        if command == "rpc-server":
            return rpc_server_command(args)
        if command == "chats":
            return chats_command(args)
        config = load_settings(args)
        if command == "run":
            return run_command(config, args.prompt, args.json, args.files)
        if command == "models":
            return pull_command(args.repo) if _pulls(args) else models_command(config,
                                                                              args.as_json)
        if command == "bench":
            return bench(config, args)
        if command == "serve":
            from chatapp.serve.command import ServeOptions, serve_command

            return serve_command(config, ServeOptions(
                args.host, args.port, args.api_key, tuple(args.cors), args.queue, args.save,
                tuple(args.served_model_name)))
        if command == "web":
            from chatapp.web import app_command, web_command

            return web_command(app_command(model_argv(args)), args.port, args.open)
        from chatapp.tui.app import run_app

        given = command_line_settings(config, vars(args))  # over the chat the app reopens
        return run_app(config, vars(args).get("config"), given)
    except UserFacingError as error:
        print(f"specchat: {error}", file=sys.stderr)
        return 1


def _stderr_progress(message: str, fraction: float | None) -> None:
    if not sys.stderr.isatty():
        return
    percent = f" {fraction:.0%}" if fraction is not None else ""
    print(f"\r\033[K{message}{percent}", end="", file=sys.stderr, flush=True)


def run_command(config: Config, prompt: str, as_json: bool, files: Sequence[str] = ()) -> int:
    """Stream one reply to stdout, the ``files`` attached to the prompt; Ctrl-C stops it
    cleanly (a second Ctrl-C quits at once)."""
    from chatapp.assembly.loader import build_session
    from chatapp.chat.attachments import read_attachment
    from chatapp.chat.conversation import Conversation
    from chatapp.chat.events import DoneEvent, TokenEvent, format_summary
    from chatapp.chat.turns import ChatEvent, PlanEvent
    from chatapp.settings.config import rpc_label

    text = sys.stdin.read() if prompt == "-" else prompt
    attachments = [read_attachment(path) for path in files]
    session = build_session(config, _stderr_progress, with_draft=config.draft_length != "0")
    _stderr_progress("", None)
    for note in session.notes:
        print(f"note: {note}", file=sys.stderr)

    def show(event: ChatEvent) -> None:
        if isinstance(event, PlanEvent):
            if event.note:
                print(f"note: {event.note}", file=sys.stderr)
        elif as_json:
            data = event.to_json()
            if isinstance(event, DoneEvent):  # the context the chat now fills, of the window
                data.update(context_tokens=event.stats.prompt_tokens + event.stats.tokens,
                            n_ctx=chat.n_ctx)
            _print_json(data)
        elif isinstance(event, TokenEvent):
            print(event.text, end="", flush=True)

    chat = Conversation(config)
    chat.attach(session)
    try:
        turn = chat.begin(text, attachments)
        _cancel_on_interrupt(turn.cancel)
        reply = chat.run(turn, show)
    finally:
        chat.close()
    if not as_json and reply.stats is not None:
        print()
        reason = reply.finish_reason
        note = "" if reason == "stop" else f" ({reason})"
        where = f" Target {rpc_label(config.rpc)}." if config.rpc else ""
        print(f"{format_summary(reply.stats)}{note}{where}", file=sys.stderr)
    return 0


def _print_json(data: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(data, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _cancel_on_interrupt(cancel: threading.Event) -> None:
    def handler(signum: int, frame: Any) -> None:
        cancel.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGINT, handler)


def models_command(config: Config, as_json: bool = False) -> int:
    """`specchat models`: the known models, what is installed, which file runs and why, and the
    models other tools keep here with their drafts (``--json``: the same as one object)."""
    from chatapp.assembly.models import found_json, found_lines, found_report, model_report

    report = found_report(config)
    if as_json:
        _print_json(found_json(report))
    else:
        print("\n".join(model_report(config) + found_lines(report)))
    return 0


def pull_command(request: str) -> int:
    """`specchat models pull REPO[:QUANT]`: the file into the Hugging Face cache."""
    from chatapp.model_stores.pull import pull

    path = pull(request, lambda line: print(line, file=sys.stderr))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
