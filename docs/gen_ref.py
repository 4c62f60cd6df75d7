"""The manual's reference pages, generated from the code at every build so that they cannot drift.

A MkDocs hook (`hooks:` in mkdocs.yml): `on_files` adds four pages that exist only in the build,

- `reference/cli.md` from the argparse parser (`service.cli.main.build_parser`), every command's
  `--help`;
- `reference/http.md` from the app's OpenAPI schema (`create_app(...).openapi()`), with who may call
  each route read from the route's own dependencies (`service.api.deps`);
- `reference/configuration.md` from `service.api.settings.Settings`: every `BRADLEY_*` variable, its
  type, bounds and default;
- `reference/python.md` from `rm.__all__`: one mkdocstrings block per public name;

and `benchmarks.md`, which is bench/RESULTS.md (the figures live beside the scripts that make them).

The tests call the same functions (tests/docs/), so a page and what a test checks are one text.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import typing
from pathlib import Path

from service.cli.main import leaves

ROOT = Path(__file__).resolve().parents[1]
HELP_COLUMNS = "100"  # argparse wraps help to the terminal: fixed, so the page is the same everywhere

# One line per setting, for someone deploying the server (type, bounds and default come from the
# class). A setting without one here shows its comment in settings.py; with neither, the build fails.
SETTING_NOTES = {
    "db": "The DuckDB store (`--db`).",
    "model": "The model to serve: an id from the store (its weights checked against the registered "
             "sha256) or a model folder (`--model`); several, comma-separated, serve an ensemble "
             "(`--model A --model B`).",
    "device": "`auto`, `cpu`, `cuda` or `cuda:N` (`--device`).",
    "torch_threads": "Threads of the forward on a CPU; unset: every core this process may use.",
    "host": "Address to bind (`--host`); the default keeps the server on this machine.",
    "port": "Port to bind (`--port`).",
    "api_keys": "Comma-separated keys, 8+ characters each; callers send `Authorization: Bearer "
                "<key>`. Writes and admin routes need one. See "
                "[Serving](../serving.md#who-may-call-what).",
    "score_requires_key": "`/score` and `/get_reward` need a key too.",
    "read_only": "Serve scores only and open no store: a scoring replica (`--read-only`).",
    "max_batch_tokens": "Padded tokens in one forward (rows × longest row); unset: 16,384 on a CPU, "
                        "65,536 on a GPU.",
    "max_batch_items": "Rows in one forward.",
    "max_padding": "Padded tokens allowed per real token in one forward; unset: 0.1 on a CPU, 1.0 "
                   "on a GPU.",
    "max_wait_ms": "How long the oldest waiting request may wait for others to share its forward.",
    "max_queue_items": "Items waiting to be scored; beyond it `/score` answers 503 (retry later).",
    "max_items_per_request": "Items in one `/score` request.",
    "max_get_reward_items": "Queries in one `/get_reward` request (OpenRLHF posts whole rollout "
                            "batches).",
    "strict_get_reward": "A `/get_reward` query that cannot be split into prompt and response is a "
                         "422 naming it, instead of being scored without its prompt.",
    "max_body_bytes": "Bytes in one request body; larger is a 413.",
    "max_text_chars": "Characters in one prompt or response; longer is a 422.",
    "body_read_timeout_s": "Seconds a request's whole body may take to arrive after its headers; "
                           "slower is a 408 (a client that stops halfway holds no slot forever).",
    "anon_max_request_chars": "Without a key: characters in all the prompts and responses of one "
                              "request (413 beyond).",
    "anon_max_concurrent": "Without a key: requests in flight per client address (429 with "
                           "`Retry-After` beyond).",
    "metrics_require_key": "`/metrics` needs a key too.",
    "drain_timeout_s": "On SIGTERM, how long the queued requests may take to finish.",
    "verifier_workers": "Worker processes that run verifier checks.",
    "verifier_timeout_s": "Wall-clock limit of one check, counted from when its worker starts it; "
                          "past it the worker is replaced and the item gets `status: timeout`.",
    "reward_weights": "Default weights of the reward parts, e.g. `rm=0.2,gsm8k=1`; see "
                      "[Verifiable rewards]"
                      "(../verifiable-rewards.md#combining-the-reward-model-and-verifiers).",
    "default_verifier": "Checker for ground truth that names none (e.g. `gsm8k`); empty: the reward "
                        "model judges such items.",
    "verifier_plugins": "Site-specific checkers, `name=module:function,...`.",
    "label_studio_webhook_secret": "Shared secret that Label Studio sends in "
                                   "`X-Bradley-Webhook-Secret` (16+ characters); unset: the webhook "
                                   "needs a key like any other write.",
    "log_level": "uvicorn's log level.",
}

# Variables read outside the settings class: by the client trainers import, the CLI or a library.
OTHER_VARIABLES = {
    "BRADLEY_API_KEY": "The key `bradley --server URL …`, `service/client.py`'s adapters and "
                       "`trl_reward_func` send.",
    "BRADLEY_URL": "The server verl's `compute_score` adapters call (default "
                   "`http://127.0.0.1:8000`).",
    "BRADLEY_RUN": "The training run `service/client.py`'s clients and adapters name in the "
                   "X-Bradley-Run header: the serving watch's `run`.",
    "BRADLEY_ALLOW_EMPTY_PROMPT": "`1`: verl's adapters score an item whose `extra_info` holds no "
                                  "prompt, instead of raising.",
    "BRADLEY_JUDGE_API_KEY": "The key `bradley label --judge openai:URL` sends.",
    "BRADLEY_ENABLE_CODE_VERIFIER": "`1`: the `code` verifier runs programs (off by default).",
    "LABEL_STUDIO_API_KEY": "Label Studio's access token for `bradley label-studio` (never a flag).",
    "LABEL_STUDIO_URL": "Label Studio's address when `--url` is not given.",
}


# --- the CLI -------------------------------------------------------------------------------------


# (command path, its parser) for every command and subcommand, depth first
commands = functools.partial(leaves, every=True)


def flags(parser: argparse.ArgumentParser) -> list[str]:
    """A parser's long options, `--help` left out."""
    return [option for action in parser._actions for option in action.option_strings
            if option.startswith("--") and option != "--help"]


def cli_markdown() -> str:
    os.environ["COLUMNS"] = HELP_COLUMNS
    from service.cli.main import build_parser

    parser = build_parser()
    parts = ["# CLI reference\n",
             "Every command's `--help`, generated from the parser at each build. The pages of the "
             "manual say what each command is for; `--db PATH` and `--server URL` go before the "
             "command.\n",
             "## bradley\n", _code(parser.format_help())]
    for path, sub in commands(parser):
        parts += [f"## bradley {' '.join(path)}\n", _code(sub.format_help())]
    return "\n".join(parts)


def _code(text: str) -> str:
    return f"```text\n{text.rstrip()}\n```\n"


# --- configuration -------------------------------------------------------------------------------


def settings_rows() -> list[tuple[str, str, str, str]]:
    """(variable, type and bounds, default, note) per field of `Settings`, in the class's order."""
    from service.api.settings import Settings

    comments = setting_comments()
    notes = {name: field.description or SETTING_NOTES.get(name) or comments.get(name)
             for name, field in Settings.model_fields.items()}
    missing = sorted(name for name, note in notes.items() if not note)
    if missing:
        raise ValueError(f"settings {missing} have no note: add one to SETTING_NOTES in "
                         "docs/gen_ref.py (or a comment beside the field in settings.py)")
    prefix = Settings.model_config["env_prefix"]
    return [(f"{prefix}{name}".upper(), _type(field), _default(field.default), notes[name])
            for name, field in Settings.model_fields.items()]


def setting_comments() -> dict[str, str]:
    """Field name -> its comment in service/api/settings.py: the one on its line, else the comment
    lines right above it, as a sentence."""
    lines = (ROOT / "service" / "api" / "settings.py").read_text().splitlines()
    comments = {}
    for i, line in enumerate(lines):
        field = re.match(r"    (\w+): .*?(?:#\s*(.*))?$", line)
        if not field:
            continue
        above = []
        for previous in reversed(lines[:i]):
            if not previous.strip().startswith("#"):
                break
            above.insert(0, previous.strip().lstrip("#").strip())
        text = field.group(2) or " ".join(above)
        if text:
            comments[field.group(1)] = text[0].upper() + text[1:].rstrip(".") + "."
    return comments


def _type(field) -> str:
    if typing.get_origin(field.annotation) is typing.Literal:
        return " / ".join(map(str, typing.get_args(field.annotation)))
    text = str(field.annotation) if "|" in str(field.annotation) else field.annotation.__name__
    text = "list" if text == "tuple" else text
    text = text.replace("typing.", "").replace(" | None", "").replace("tuple[str, ...]", "list")
    bounds = [f"{symbol} {getattr(m, attr)}" for m in field.metadata
              for attr, symbol in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"),
                                   ("min_length", "length ≥")) if hasattr(m, attr)]
    return ", ".join([text, *bounds])


def _default(value) -> str:
    if value is None or value == "" or value == ():
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int) and value >= 10_000:
        return f"{value:,}"
    return str(value)


def config_markdown() -> str:
    head = ["# Configuration reference\n",
            "`bradley serve` reads its settings from the environment and validates them at "
            "start-up: a bad value stops the server with a message naming the variable. A flag "
            "(`--host`, `--port`, `--model`, `--device`, `--read-only`, `--db`) overrides its "
            "variable. Generated from `service.api.settings.Settings` at each build.\n",
            "| variable | default | what it does (type) |", "| --- | --- | --- |"]
    rows = [f"| `{name}` | {default} | {note} ({kind}) |"
            for name, kind, default, note in settings_rows()]
    other = ["\n## Read elsewhere\n", "Not server settings: read by the client, the CLI or a "
             "library where they are used.\n", "| variable | what it does |", "| --- | --- |"]
    other += [f"| `{name}` | {note} |" for name, note in OTHER_VARIABLES.items()]
    return "\n".join(head + rows + other) + "\n"


# --- the HTTP API --------------------------------------------------------------------------------

# Who may call a route, by the caller dependency its signature declares (service/api/deps.py).
ACCESS = {
    "require_key": "a key (`Authorization: Bearer <key>`; 401 without, 403 with a wrong one)",
    "webhook_caller": "Label Studio's shared secret (`X-Bradley-Webhook-Secret`) or a key",
    "scoring_caller": "anyone, within the budgets for callers without a key, unless "
                      "`BRADLEY_SCORE_REQUIRES_KEY` is set",
    "optional_key": "anyone; a key shows more",
    "metrics_caller": "anyone, unless `BRADLEY_METRICS_REQUIRE_KEY` is set",
}
BODIES = {"json_body": "a JSON object",
          "upload_records": "a JSON object, a JSON list of objects, or JSONL"}


def openapi_schema() -> dict:
    """The schema `GET /openapi.json` serves, from an app that opens no store and loads no model."""
    from service.api.app import create_app
    from service.api.settings import load_settings

    return create_app(load_settings(read_only=True)).openapi()


def route_dependencies() -> dict[tuple[str, str], set[str]]:
    """(METHOD, path) -> the names of every function the route depends on, however deep."""
    from fastapi.routing import APIRoute

    from service.api.app import create_app
    from service.api.settings import load_settings

    def names(dependant) -> set[str]:
        found = set()
        for dep in dependant.dependencies:
            found |= {getattr(dep.call, "__name__", "")} | names(dep)
        return found

    app = create_app(load_settings(read_only=True))
    return {(method, route.path): names(route.dependant) for route in app.routes
            if isinstance(route, APIRoute) for method in route.methods}


def http_markdown() -> str:
    schema, deps = openapi_schema(), route_dependencies()
    parts = ["# HTTP reference\n",
             "Every route of `bradley serve`, generated at each build from the app's OpenAPI schema, "
             "which the server also serves at `GET /openapi.json` (with a key). Who may call a route "
             "comes from its signature. How the routes are used: [Serving](../serving.md), "
             "[Connecting trainers](../trainers.md), [Data in](../data.md#uploads-over-http).\n"]
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            used = deps.get((method.upper(), path), set())
            parts.append(_operation(method.upper(), path, op, used))
    components = schema.get("components", {}).get("schemas", {})
    if components:
        parts.append("## Schemas\n")
        parts += [f"### {name}\n\n{_fields_table(body)}" for name, body in components.items()]
    return "\n".join(parts)


def _operation(method: str, path: str, op: dict, used: set[str]) -> str:
    lines = [f"## {method} {path}\n"]
    if op.get("description"):
        lines.append(" ".join(op["description"].split()) + "\n")
    access = [text for name, text in ACCESS.items() if name in used]
    lines.append(f"**Who may call:** {access[0] if access else 'anyone'}.\n")
    params = op.get("parameters", [])
    if params:
        lines += ["| parameter | in | type | required |", "| --- | --- | --- | --- |"]
        lines += [f"| `{p['name']}` | {p['in']} | {_type_of(p.get('schema', {}))} | "
                  f"{'yes' if p.get('required') else 'no'} |" for p in params]
        lines.append("")
    body = op.get("requestBody", {}).get("content", {})
    for content_type, media in body.items():
        table = _fields_table(media.get("schema", {}))
        lines.append(f"**Request body** (`{content_type}`):\n\n{table}")
    if not body:
        kinds = [text for name, text in BODIES.items() if name in used]
        if kinds:
            lines.append(f"**Request body:** {kinds[0]}; its fields are not in the schema.\n")
    for status, response in op.get("responses", {}).items():
        lines.append(f"**{status}** {response.get('description', '')}\n")
        for media in response.get("content", {}).values():
            table = _fields_table(media.get("schema", {}))
            if table.strip():
                lines.append(table)
    return "\n".join(lines)


def _fields_table(schema: dict) -> str:
    properties = schema.get("properties")
    if "$ref" in schema:
        return f"{_type_of(schema)}\n"
    if not properties:
        return ""
    required = set(schema.get("required", []))
    rows = ["| field | type | required | description |", "| --- | --- | --- | --- |"]
    rows += [f"| `{name}` | {_type_of(prop)} | {'yes' if name in required else 'no'} | "
             f"{' '.join(prop.get('description', '').split())} |"
             for name, prop in properties.items()]
    nested = [f"\n`{name}[]`, each:\n\n{_fields_table(prop['items'])}" for name, prop in properties.items()
              if prop.get("type") == "array" and prop.get("items", {}).get("properties")]
    return "\n".join(rows) + "\n" + "".join(nested)


def _type_of(schema: dict) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema or "oneOf" in schema:
        options = schema.get("anyOf") or schema.get("oneOf")
        return " or ".join(_type_of(s) for s in options)
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    if schema.get("type") == "array":
        return f"array of {_type_of(schema.get('items', {}))}"
    return schema.get("type", "any")


# --- the Python API ------------------------------------------------------------------------------


def public_api() -> dict[str, str]:
    """Public name -> its definition's dotted path, from `rm`'s table (read without importing torch)."""
    import rm

    return {name: f"{rm._HOMES[name]}.{rm._ALIASES.get(name, name)}" for name in rm.__all__}


def python_markdown() -> str:
    parts = ["# Python API reference\n",
             "`import rm` gives the names below (`rm.__all__`), each documented from its docstring at "
             "each build. [Training from Python](../python.md) shows them at work.\n"]
    for name, target in public_api().items():
        parts += [f"## rm.{name}\n", f"::: {target}\n    options:\n      show_root_heading: false\n"]
    return "\n".join(parts)


# --- the hook ------------------------------------------------------------------------------------

def benchmarks_markdown() -> str:
    """bench/RESULTS.md as the manual's Benchmarks page: the figures stay beside the scripts."""
    return (ROOT / "bench" / "RESULTS.md").read_text()


PAGES = {
    "benchmarks.md": benchmarks_markdown,
    "reference/cli.md": cli_markdown,
    "reference/http.md": http_markdown,
    "reference/configuration.md": config_markdown,
    "reference/python.md": python_markdown,
}


def on_files(files, config):
    from mkdocs.structure.files import File

    for path, make in PAGES.items():
        files.append(File.generated(config, path, content=make()))
    return files
