"""The layers import one way: server -> engine -> model -> text, never up and never past the layer below; the
rooms beside them (the benchmarks, the model-file commands, the command line, the offline API) only what
their table names; inside model/ and engine/, each room imports only the rooms its table lists; and no
module imports itself back through others, in the package, models/ or tools/.

Every import statement of every module is read (function-local ones and those under TYPE_CHECKING too), so
a lazy import cannot slip past. docs/DESIGN.md draws the layers and the rooms; the shared bottom
(settings, sampling parameters, the generated API stubs, the cgroup reader) may be imported from anywhere.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers.paths import ROOT

PACKAGE = ROOT / "daemon" / "nvllm"
SHARED = {"nvllm", "nvllm.config", "nvllm.config_upstreams", "nvllm.config_values", "nvllm.sampling_params",
          "nvllm.pooling_params", "nvllm.transcription_params", "nvllm.v1", "nvllm.cgroup"}
TEXT = "nvllm.text"
AUDIO = "nvllm.audio"      # an upload's bytes -> samples and Whisper's features: input, as text is; never server/'s

# layer or room of the package root -> the nvllm packages (by prefix) it may import besides itself and the
# shared bottom. Every folder and module of daemon/nvllm is one of these or the shared bottom.
ALLOWED = {
    "server": {"nvllm.engine"},
    "engine": {"nvllm.model", TEXT, AUDIO},
    "model": {TEXT, AUDIO},
    "text": set(),
    "audio": set(),
    "llm": {"nvllm.engine", AUDIO},                             # the offline API (LLM)
    "bench": {"nvllm.engine", "nvllm.model", AUDIO},            # the benchmarks
    "model_files": {"nvllm.model"},                             # pull, list, synthesize, quantize
    "cli": {"nvllm.server", "nvllm.engine", "nvllm.llm", "nvllm.bench", "nvllm.model_files"},
}

# model/'s rooms, bottom first -> the other rooms of model/ each may import. The forward pass's layers
# (attention, kv_cache, kv_layout, decoder: the modules directly in model/) may import every room.
M = "nvllm.model."
ROOMS = {
    "quant": set(),                                              # block formats, NumPy only
    "config": set(),                                             # ModelConfig from config.json
    "encoder_config": {M + "config"},                            # EncoderConfig from config.json
    "whisper_config": {M + "config"},                            # WhisperConfig from config.json
    "pooler": set(),                                             # token states -> one vector
    "sampling": set(),                                           # logits -> tokens
    "kernels": {M + "quant"},                                    # C and its wrappers and twins
    "matrix": {M + "kernels", M + "quant"},                      # a weight that multiplies itself
    "weights": {M + "config", M + "encoder_config", M + "whisper_config", M + "pooler", M + "matrix",
                M + "kernels", M + "quant"},                     # weight files -> weights
}

# engine/'s rooms, bottom first -> the other rooms of engine/ each may import. The step loop stays directly in
# engine/: the modules a request's state lives in at the bottom, the concerns on them, the step over them
# all; assembly/ puts an engine together.
E = "nvllm.engine."
_BOOKS = {E + "outputs", E + "sequence", E + "block_manager", E + "prompt"}
ENGINE_ROOMS = {
    "outputs": set(),                                            # what a request's steps hand back
    "sequence": {E + "outputs"},                                 # one request's state
    "block_audit": set(),                                        # the page books' rules, checked
    "block_manager": {E + "block_audit"},                        # the page books
    "prompt": set(),                                             # a request's prompt -> token ids
    "pooling_request": {E + "prompt"},                           # a pooling request's input, checked
    "transcription": {E + r for r in ("outputs", "sequence", "scheduler", "sampling_rows")},   # speech's windows
    "structured": set(),                                         # constraints -> matchers and masks
    "speculation": {E + "sequence"},                             # proposals, verified
    "warm": _BOOKS,                                              # pinned prompts, the persisted cache
    "scheduler": {E + "sequence", E + "block_manager"},          # who runs next
    "sampling_rows": {E + "sequence"},                           # the sampler's rows of a step
    "packing": {E + "scheduler", E + "sampling_rows"},           # a step's tokens -> the model's batch
    "stops": {E + "outputs", E + "sequence"},                    # a token appended, stops checked, outputs
    "llm_engine": _BOOKS | {E + r for r in ("scheduler", "sampling_rows", "packing", "stops", "structured",
                                            "speculation", "warm", "pooling_request", "transcription")},  # the step
    "turns": set(),                                              # one engine's step at a time
    "request_stream": {E + "outputs", E + "sequence"},           # one request, pending or streamed
    "async_engine": _BOOKS | {E + "llm_engine", E + "turns", E + "request_stream"},   # the engine thread
    "assembly": {E + r for r in ("outputs", "sequence", "block_manager", "prompt", "structured", "speculation",
                                 "warm", "scheduler", "sampling_rows", "packing", "llm_engine", "async_engine",
                                 "pooling_request", "transcription")},
}

# What server/ may know of the engine: its asyncio side and what it hands back, the prompt's type, the factory
# and the memory reading an engine is built from, the thinking tags. Never a request's state (sequence.py)
# nor the step: a front door is a translation of its wire format (DaemonState.submit is the one way in).
SERVER_SEES = {E + m for m in ("async_engine", "outputs", "prompt", "assembly.factory", "assembly.memory",
                               "structured.thinking")}

# server/'s rooms, bottom first -> the other rooms of server/ each may import. The front doors (grpc/, http/)
# are translations onto the one way in (state, submission, pooling); the daemon's life (daemon.py) wires
# everything together and nothing imports it back.
S = "nvllm.server."
SERVER_ROOMS = {
    "chat": set(),                                               # what every chat front door shares
    "clients": set(),                                            # whom a call counts against
    "health": set(),                                             # the daemon's health, neutral
    "metrics": set(),                                            # Prometheus series
    "logs": set(),                                               # journald-friendly lines, request ids
    "listen": set(),                                             # binding the gRPC listener
    "systemd": set(),                                            # sd_notify, the watchdog pinger
    "metrics_listener": {S + "listen"},                          # /metrics over plain HTTP
    "board": set(),                                              # the board's heat and memory
    "models": {S + "chat"},                                      # which models, their slots and leases
    "submission": {S + "metrics"},                               # what submit hands back
    "reading": set(),                                            # what a front door's reader hands submit
    "state": {S + r for r in ("board", "health", "metrics", "models", "reading", "submission")},  # the way in
    "pooling": {S + "state"},                                    # embed and rerank through submit
    "transcribing": {S + r for r in ("reading", "state", "submission")},   # speech to text through submit
    "voice": {S + r for r in ("models", "state", "transcribing")},   # a chat's audio heard, through submit
    "upstream": {S + r for r in ("metrics", "models", "state")},   # a bigger server answers what is refused
    "grpc": {S + r for r in ("chat", "clients", "health", "logs", "models", "pooling", "reading", "state",
                             "submission", "transcribing", "upstream", "voice")},   # the gRPC front door
    "http": {S + r for r in ("chat", "clients", "health", "listen", "logs", "metrics", "models", "pooling",
                             "reading", "state", "submission", "transcribing", "upstream", "voice")},  # the HTTP
    "daemon": {S + r for r in ("board", "grpc", "http", "listen", "logs", "metrics_listener", "models",
                               "state", "systemd", "upstream")},             # the daemon's life
}


def nvllm_imports(path: Path, package: Path | None = None) -> list[tuple[int, str]]:
    """(line, module) of every import of an nvllm module in the file; `from a import b` names a.b too
    where b is a module or package of a."""
    root = (package or PACKAGE).parent
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            base = root / node.module.replace(".", "/")
            subs = [a.name for a in node.names if (base / a.name).is_dir() or (base / f"{a.name}.py").is_file()]
            found += [(node.lineno, f"{node.module}.{s}") for s in subs]
            if len(subs) < len(node.names):
                found.append((node.lineno, node.module))
    return [(line, m) for line, m in found if m == "nvllm" or m.startswith("nvllm.")]


def is_under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _shared(module: str) -> bool:
    return module == "nvllm" or any(is_under(module, p) for p in SHARED - {"nvllm"})


def _paths(here: Path) -> list[Path]:
    """A package's modules, or the one module `here` names without its .py."""
    return sorted(here.rglob("*.py")) if here.is_dir() else [here.with_suffix(".py")]


def violations(layer: str) -> list[str]:
    ok = ALLOWED[layer] | {f"nvllm.{layer}"}
    bad = []
    for path in _paths(PACKAGE / layer):
        for line, module in nvllm_imports(path):
            if not _shared(module) and not any(is_under(module, p) for p in ok):
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}")
    return bad


def room_violations(room: str, layer: str = "model") -> list[str]:
    """Imports of `layer`'s other rooms by `room` that its table (ROOMS, ENGINE_ROOMS, SERVER_ROOMS) does not
    list."""
    table, prefix = {"model": (ROOMS, M), "engine": (ENGINE_ROOMS, E), "server": (SERVER_ROOMS, S)}[layer]
    ok = table[room] | {prefix + room}
    bad = []
    for path in _paths(PACKAGE / layer / room):
        for line, module in nvllm_imports(path):
            if is_under(module, f"nvllm.{layer}") and not any(is_under(module, p) for p in ok):
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}")
    return bad


def module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_cycles(package: Path) -> list[list[str]]:
    """Every cycle of the package's imports (see cycles)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        graph[module_name(path, package)] = {m for _, m in nvllm_imports(path, package)}
    return cycles(graph)


def script_cycles(folder: Path) -> list[list[str]]:
    """Every cycle among the scripts of a folder (models/, tools/), which import each other by name:
    `import x`, `from x import y`, `__import__("x")`."""
    paths = sorted(folder.glob("*.py"))
    names = {p.stem for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__" \
                    and node.args and isinstance(node.args[0], ast.Constant):
                found.add(str(node.args[0].value))
        graph[path.stem] = found & names
    return cycles(graph)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (or a module importing itself),
    each sorted: every cycle, by Tarjan's algorithm."""
    for deps in graph.values():
        deps &= graph.keys()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1 or v in graph[v]:
                cycles.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports_only_what_lies_directly_below(layer: str) -> None:
    assert violations(layer) == []


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_a_room_of_model_imports_only_the_rooms_below_it(room: str) -> None:
    assert room_violations(room) == []


@pytest.mark.parametrize("room", sorted(ENGINE_ROOMS))
def test_a_room_of_engine_imports_only_the_rooms_its_table_lists(room: str) -> None:
    assert room_violations(room, "engine") == []


def test_the_server_sees_only_the_engines_public_side() -> None:
    bad = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
           for path in _paths(PACKAGE / "server") for line, module in nvllm_imports(path)
           if is_under(module, "nvllm.engine") and module not in SERVER_SEES]
    assert bad == []


@pytest.mark.parametrize("room", sorted(SERVER_ROOMS))
def test_a_room_of_server_imports_only_the_rooms_its_table_lists(room: str) -> None:
    assert room_violations(room, "server") == []


def test_every_module_of_server_is_in_a_room() -> None:
    assert _members(PACKAGE / "server") == set(SERVER_ROOMS)


def test_the_servers_module_names_are_its_own() -> None:
    """No two modules of server/ share a name, nor one of server/ a module's name elsewhere in the package:
    a name says which module it is."""
    def names(folder: Path) -> list[str]:
        return [p.stem for p in folder.rglob("*.py") if p.stem not in ("__init__", "__main__")]
    ours = names(PACKAGE / "server")
    elsewhere = {n for d in PACKAGE.iterdir() if d.is_dir() and d.name != "server" for n in names(d)} | \
        {p.stem for p in PACKAGE.glob("*.py")}
    assert sorted(n for n in set(ours) if ours.count(n) > 1 or n in elsewhere) == []


def _members(folder: Path) -> set[str]:
    """The modules (stems) and packages directly in folder."""
    return ({p.stem for p in folder.glob("*.py")} - {"__init__"}) | \
        {p.name for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}


def test_every_folder_and_module_of_the_package_is_a_layer_a_room_or_the_shared_bottom() -> None:
    shared = {m.split(".", 1)[1] for m in SHARED if "." in m}
    assert _members(PACKAGE) == set(ALLOWED) | shared


def test_every_module_of_engine_is_in_a_room() -> None:
    assert _members(PACKAGE / "engine") == set(ENGINE_ROOMS)
    for room in ENGINE_ROOMS:
        assert (PACKAGE / "engine" / room).is_dir() or (PACKAGE / "engine" / f"{room}.py").is_file(), room


def test_every_module_of_model_is_in_a_room_or_is_a_layer_of_the_forward_pass() -> None:
    one_file_rooms = {"config", "encoder_config", "whisper_config", "pooler"}
    loose = {p.stem for p in (PACKAGE / "model").glob("*.py")} - {"__init__"} - one_file_rooms
    rooms = {p.name for p in (PACKAGE / "model").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert loose == {"attention", "decoder", "encoder", "kv_cache", "kv_layout", "workspace", "whisper",
                     "whisper_encoder", "whisper_cross"}
    assert rooms == set(ROOMS) - one_file_rooms


def test_no_module_imports_itself_back() -> None:
    assert import_cycles(PACKAGE) == []


@pytest.mark.parametrize("folder", ["models", "tools"])
def test_no_script_imports_itself_back(folder: str) -> None:
    assert script_cycles(ROOT / folder) == []


def test_the_check_sees_scripts_importing_each_other(tmp_path: Path) -> None:
    (tmp_path / "maker.py").write_text("import json\nBUILDERS = __import__('extra').BUILDERS\n")
    (tmp_path / "extra.py").write_text("def f():\n    import maker\n")
    (tmp_path / "alone.py").write_text("from maker import x\n")
    assert script_cycles(tmp_path) == [["extra", "maker"]]


def test_the_check_sees_a_reach_down_past_the_layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "nvllm"
    (fake / "server").mkdir(parents=True)
    (fake / "model").mkdir()
    (fake / "text").mkdir()
    (fake / "server" / "x.py").write_text(
        "from nvllm.engine.assembly import factory\n"
        "def f():\n    from nvllm.model.decoder import Model\n    import nvllm.text.tokenizer\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert violations("server") == ["nvllm/server/x.py:3 imports nvllm.model.decoder",
                                    "nvllm/server/x.py:4 imports nvllm.text.tokenizer"]


def test_the_check_sees_a_room_reaching_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "nvllm"
    (fake / "model" / "kernels").mkdir(parents=True)
    (fake / "model" / "matrix").mkdir()
    (fake / "model" / "matrix" / "dense.py").write_text("")
    (fake / "model" / "kernels" / "x.py").write_text(
        "from nvllm.model.quant.formats import FORMATS\nfrom nvllm.model.matrix import dense\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert room_violations("kernels") == ["nvllm/model/kernels/x.py:2 imports nvllm.model.matrix.dense"]


def test_the_check_sees_a_cycle_through_a_lazy_or_type_checking_import(tmp_path: Path) -> None:
    fake = tmp_path / "nvllm"
    (fake / "a").mkdir(parents=True)
    (fake / "a" / "__init__.py").write_text("")
    (fake / "a" / "one.py").write_text("from nvllm.a import two\n")
    (fake / "a" / "two.py").write_text("def f():\n    from nvllm.a.three import g\n")
    (fake / "a" / "three.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from nvllm.a.one import x\n")
    (fake / "a" / "four.py").write_text("import nvllm.a.one\n")
    assert import_cycles(fake) == [["nvllm.a.one", "nvllm.a.three", "nvllm.a.two"]]
