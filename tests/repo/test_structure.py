"""The library's shape (issues 21 and 38): no import circle at run time among its modules, nor
among its folders (the parts: ``outbox/_buffer/``, ``outbox/_worker/``, ...), and no file, class
(with its base classes from the library) or function too long to read in one sitting.

Every import is followed, module level and function level alike; only those under
``if TYPE_CHECKING:`` are not (they never run)."""

from __future__ import annotations

import ast
from pathlib import Path

import outbox

ROOT = Path(outbox.__file__).parent


def _module_name(path: Path) -> str:
    parts = ["outbox", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if "TYPE_CHECKING" in ast.unparse(node.test):
                for child in node.orelse:
                    self.visit(child)
                return
            self.generic_visit(node)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                found.add(candidate if candidate in modules else target)

        def visit_Import(self, node: ast.Import) -> None:
            found.update(alias.name for alias in node.names)

    Visitor().visit(ast.parse(path.read_text()))
    return {module for module in found if module in modules and module != name}


def import_graph() -> dict[str, set[str]]:
    paths = sorted(ROOT.rglob("*.py"))
    modules = {_module_name(path) for path in paths}
    return {_module_name(path): _imports(path, modules) for path in paths}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_checker_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_among_the_librarys_modules():
    graph = import_graph()
    assert len(graph) > 40  # it read the library
    assert "outbox._run._serde" in graph["outbox._worker._intake"]  # and followed its imports
    assert circles(graph) == []


def part(module: str) -> str:
    """The part a module belongs to: its folder right under ``outbox/`` (``outbox._worker``
    for ``outbox._worker._intake``, ``outbox.transports`` for ``outbox.transports._http._answers``),
    or the module itself at the top (``outbox._outbox``)."""
    return ".".join(module.split(".")[:2])


def part_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    parts: dict[str, set[str]] = {}
    for module, imported in graph.items():
        parts.setdefault(part(module), set()).update(part(m) for m in imported if part(m) != part(module))
    return parts


def test_no_import_circle_among_the_librarys_folders():
    """#38: the parts are layered: a folder imports only from folders below it (its
    ``__init__`` docstring names them), so each can be read, and tested, with what is below."""
    assert part("outbox._worker._intake") == "outbox._worker"
    assert part("outbox.transports._http._answers") == "outbox.transports"
    assert part("outbox._outbox") == "outbox._outbox"
    parts = part_graph(import_graph())
    assert {"outbox._buffer", "outbox._worker", "outbox._spill", "outbox._runtime"} <= set(parts)
    assert "outbox._buffer" in parts["outbox._worker"]  # it followed imports across folders
    assert circles(parts) == []


def test_each_folder_says_what_it_owns_and_may_import():
    folders = [path.parent for path in ROOT.rglob("__init__.py") if path.parent.name != "tools"]
    assert len(folders) >= 9  # the parts, the transports and HTTP's folder
    for folder in folders:
        if folder == ROOT or "tools" in folder.relative_to(ROOT).parts:
            continue
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
        assert "import" in doc, f"{folder}: its __init__ docstring says what it owns and may import"


# -- sizes (issue 21): each part readable in one sitting ------------------------------------

MAX_FILE_LINES = 650
#: A class, and a class with its base classes from the library (#38: a class is split by
#: composition, not by moving half of it into a base class in another module).
MAX_CLASS_LINES = 450
MAX_FUNCTION_LINES = 60


def oversized(path: Path, source: str) -> list[str]:
    """What in ``source`` (the text of ``path``) is over the limits: the file, a class or a
    function (methods and nested functions included), as measured by ``ast``: from its
    ``def``/``class`` line (decorators not counted) to its last line."""
    found = []
    lines = len(source.splitlines())
    if lines > MAX_FILE_LINES:
        found.append(f"{path}: file of {lines} lines (limit {MAX_FILE_LINES})")
    tree = ast.parse(source)
    scopes: list[tuple[ast.AST, str]] = [(tree, "")]
    while scopes:
        node, prefix = scopes.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                size = (child.end_lineno or child.lineno) - child.lineno + 1
                limit = MAX_CLASS_LINES if isinstance(child, ast.ClassDef) else MAX_FUNCTION_LINES
                if size > limit:
                    kind = "class" if isinstance(child, ast.ClassDef) else "function"
                    found.append(f"{path}:{child.lineno}: {kind} {name} of {size} lines (limit {limit})")
                scopes.append((child, f"{name}."))
            else:
                scopes.append((child, prefix))
    return found


def test_the_size_checker_finds_a_long_file_class_and_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    function = f"def f():\n{body}\n"
    assert oversized(Path("f.py"), function) == [
        f"f.py:1: function f of {MAX_FUNCTION_LINES + 1} lines (limit 60)"
    ]
    method = "class C:\n" + "\n".join("    " + line for line in function.splitlines()) + "\n"
    assert oversized(Path("c.py"), method) == [
        f"c.py:2: function C.f of {MAX_FUNCTION_LINES + 1} lines (limit 60)"
    ]
    nested = "if True:\n" + "\n".join("    " + line for line in function.splitlines()) + "\n"
    assert len(oversized(Path("n.py"), nested)) == 1  # found under an if, too
    big = "class C:\n" + "\n".join(f"    def m{i}(self):\n        pass" for i in range(MAX_CLASS_LINES // 2))
    assert oversized(Path("b.py"), big) == [
        f"b.py:1: class C of {MAX_CLASS_LINES + 1} lines (limit {MAX_CLASS_LINES})"
    ]
    long_file = "\n".join(f"x{i} = {i}" for i in range(MAX_FILE_LINES + 1)) + "\n"
    assert oversized(Path("l.py"), long_file) == [f"l.py: file of {MAX_FILE_LINES + 1} lines (limit 650)"]
    assert oversized(Path("ok.py"), function.replace("    x0 = 0\n", "")) == []


def test_no_library_file_class_or_function_over_the_limits():
    paths = sorted(ROOT.rglob("*.py"))
    assert len(paths) > 40  # it read the library
    found = [
        problem for path in paths for problem in oversized(path.relative_to(ROOT.parent), path.read_text())
    ]
    assert found == [], "\n".join(found)


_MUTATORS = {
    "add",
    "append",
    "appendleft",
    "clear",
    "discard",
    "extend",
    "pop",
    "popleft",
    "remove",
    "update",
}


def buffer_writes(path: Path, source: str) -> list[str]:
    """Where ``source`` writes a field of a buffer or of its holdings (``buf.x = ...``,
    ``buffer.x += ...``, ``self.buffer.x[k] = ...``, ``buf.holdings.queue.append(...)``): outside
    the buffer's own modules, their methods are the only way to change its accounts.  A write
    through a local alias (``queue = buf.holdings.queue; queue.append(...)``) is not seen: a
    reviewer's to catch."""

    def is_field(node: ast.AST) -> bool:
        owner = node.value if isinstance(node, ast.Attribute) else None
        return (isinstance(owner, ast.Name) and owner.id in ("buf", "buffer", "held", "holdings")) or (
            isinstance(owner, ast.Attribute) and owner.attr in ("buffer", "holdings")
        )

    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for part in target.elts if isinstance(target, ast.Tuple | ast.List) else [target]:
                if is_field(part) or (isinstance(part, ast.Subscript) and is_field(part.value)):
                    found.append(f"{path}:{node.lineno}: writes {ast.unparse(part)}")
        call = node.func if isinstance(node, ast.Call) else None
        if isinstance(call, ast.Attribute) and call.attr in _MUTATORS and is_field(call.value):
            found.append(f"{path}:{node.lineno}: calls {ast.unparse(node.func)}")
    return found


def test_the_buffer_write_finder_finds_each_kind_of_write():
    source = (
        "buf.beyond += 1\n"
        "self.loop_thread = self.buffer.no_block_thread = 3\n"
        "buf.room_events, buf.room_bytes = 0, -1\n"
        "buf.dropped['x'] -= 1\n"
        "buffer.queue.append(e)\n"
        "buf.holdings.in_flight -= 1\n"
        "held.sizes[0] = 3\n"
        "buf.count_locked('x', 1)\n"  # a method: allowed
        "n = buf.in_flight\n"  # a read: allowed
        "n = buf.holdings.in_flight\n"  # a read: allowed
    )
    assert buffer_writes(Path("w.py"), source) == [
        "w.py:1: writes buf.beyond",
        "w.py:2: writes self.buffer.no_block_thread",
        "w.py:3: writes buf.room_events",
        "w.py:3: writes buf.room_bytes",
        "w.py:4: writes buf.dropped['x']",
        "w.py:6: writes buf.holdings.in_flight",
        "w.py:7: writes held.sizes[0]",
        "w.py:5: calls buffer.queue.append",  # (a call is a statement's child: found after)
    ]


def test_only_the_buffer_writes_its_fields():
    """#21: the worker, the outbox, the sidecar and the spill change the buffer's accounts
    through the methods of the buffer and of its part ``Holdings`` only, which keep them whole."""
    own = {"_buffer.py", "_holdings.py"}
    paths = [path for path in sorted(ROOT.rglob("*.py")) if path.name not in own]
    assert len(paths) > 40  # it read the library
    found = [
        problem
        for path in paths
        for problem in buffer_writes(path.relative_to(ROOT.parent), path.read_text())
    ]
    assert found == [], "\n".join(found)


def classes_with_bases(paths: list[Path]) -> dict[str, int]:
    """Each library class (``module.Class``) and its length plus that of its base classes from
    the library, followed through the names its module defines or imports from the library."""
    sizes: dict[str, int] = {}
    bases: dict[str, list[str]] = {}
    for path in paths:
        module = _module_name(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        names: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{target}.{alias.name}"
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                names[node.name] = f"{module}.{node.name}"
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                key = f"{module}.{node.name}"
                sizes[key] = (node.end_lineno or node.lineno) - node.lineno + 1
                bases[key] = [names[b.id] for b in node.bases if isinstance(b, ast.Name) and b.id in names]

    def total(key: str, seen: frozenset[str] = frozenset()) -> int:
        return sizes[key] + sum(total(b, seen | {key}) for b in bases[key] if b in sizes and b not in seen)

    return {key: total(key) for key in sizes}


# -- the tools' surface (#38) ----------------------------------------------------------------

TOOLS = ROOT / "tools"


def private_imports(path: Path, source: str | None = None) -> list[str]:
    """The library modules ``path`` (a tool; its text unless ``source`` is given) imports that
    are private to the library: any module with a ``_`` part under ``outbox`` (or a ``_`` name
    imported from ``outbox``), but for ``outbox._toolkit`` and the tools' own modules.  Every
    import counts, function-level and under ``try`` included."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            targets = [target] + [f"{target}.{a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        for target in targets:
            parts = target.split(".")
            if parts[0] != "outbox" or parts[1:2] == ["tools"] or target == "outbox._toolkit":
                continue
            if any(part.startswith("_") and not part.startswith("__") for part in parts[1:]):
                found.append(target)
    return found


def test_the_private_import_finder_sees_each_kind():
    source = (
        "from .. import ConfigError, Outbox, __version__\n"  # public
        "from .._toolkit import serialize\n"  # the tools' surface
        "from . import _args\n"  # the tools' own
        "from ..transports import HttpTransport\n"
        "def f():\n"
        "    from .._worker import _intake\n"
        "    from outbox import _buffer\n"
        "    import outbox._run._serde\n"
    )
    found = private_imports(TOOLS / "probe.py", source)
    assert found == ["outbox._worker", "outbox._worker._intake", "outbox._buffer", "outbox._run._serde"]


def test_the_tools_use_the_public_api_and_the_toolkit():
    """#38: the tools (``outbox/tools/``) stand on the public API plus ``outbox._toolkit``, the
    one module made for them; at most three tool files reach anything else private (today
    one: the instructions benchmark turns the sidecar's sampling off, by its place in this
    tree or an earlier one's)."""
    paths = sorted(TOOLS.rglob("*.py"))
    assert len(paths) > 20  # it read the tools
    reaching = {str(path.relative_to(ROOT)): private_imports(path) for path in paths}
    reaching = {path: found for path, found in reaching.items() if found}
    assert len(reaching) <= 3, reaching
    assert set(reaching) <= {"tools/benchmarks/_instructions_child.py"}, reaching
    uses = [path for path in paths if "_toolkit" in path.read_text()]
    assert len(uses) >= 5  # the scan sees what the tools import


def test_the_library_never_imports_the_tools_or_the_toolkit():
    graph = import_graph()
    for module, imported in graph.items():
        if module.startswith("outbox.tools") or module == "outbox._toolkit":
            continue
        assert not {m for m in imported if m.startswith("outbox.tools") or m == "outbox._toolkit"}, module


# -- docs/architecture.md matches the tree (#38) ---------------------------------------------


def architecture_sections(text: str) -> dict[str, str]:
    """docs/architecture.md's sections about the tree, by folder (``outbox/_worker``): each
    ``### ... `outbox/FOLDER/` ...`` heading and the text up to the next heading."""
    import re

    sections: dict[str, str] = {}
    for match in re.finditer(r"^### [^\n]*?`(outbox(?:/[^`]*)?)/`[^\n]*\n(.*?)(?=^##|\Z)", text, re.M | re.S):
        sections[match.group(1)] = match.group(2)
    return sections


def test_the_architecture_page_names_every_module_in_its_folders_section():
    text = (ROOT.parent / "docs" / "architecture.md").read_text()
    sections = architecture_sections(text)
    assert {"outbox", "outbox/_worker", "outbox/transports/_http", "outbox/tools/benchmarks"} <= set(sections)
    missing = []
    folders = {path.parent for path in ROOT.rglob("*.py")}
    for folder in sorted(folders):
        name = str(folder.relative_to(ROOT.parent))
        section = sections.get(name)
        if section is None:
            missing.append(f"{name}/: no section")
            continue
        for path in sorted(folder.glob("*.py")):
            if path.name == "__init__.py" and folder != ROOT and name != "outbox/transports":
                continue  # a folder's __init__ is its section's heading
            if (
                f"`{path.name}`" not in section
                and f"{path.name}`" not in section
                and f" {path.name}" not in section
            ):
                missing.append(f"{name}/{path.name}")
    assert missing == [], missing


def test_no_library_class_with_its_bases_over_the_limit():
    paths = [path for path in sorted(ROOT.rglob("*.py")) if "tools" not in path.relative_to(ROOT).parts]
    sizes = classes_with_bases(paths)
    # It followed base classes, across modules: _TimedOutboxRun (4 lines) is also its bases
    # _OutboxRun (_outbox.py) and TimedRun (_run/_run.py).
    assert sizes["outbox._outbox._TimedOutboxRun"] > 200
    found = {key: size for key, size in sizes.items() if size > MAX_CLASS_LINES}
    assert found == {}, found


def parts_diagram(text: str) -> str:
    """docs/architecture.md's drawing of the parts: the first code block under "## The parts"."""
    import re

    match = re.search(r"^## The parts\n.*?```\n(.*?)```", text, re.M | re.S)
    assert match, "no drawing under '## The parts'"
    return match.group(1)


def test_the_architecture_diagram_draws_every_part_in_its_layer_and_names_files_that_exist():
    """#38: the drawing of the parts names each folder and top module of ``outbox/``, a folder
    drawn above every folder it imports ("each layer imports only from layers below it"), and
    every path the page names (``_worker/_intake.py``) is a file of the tree."""
    import re

    text = (ROOT.parent / "docs" / "architecture.md").read_text()
    diagram = parts_diagram(text)
    rows = diagram.splitlines()
    folders = sorted(p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name != "tools")
    row_of = {}
    for folder in folders:
        found = [i for i, row in enumerate(rows) if re.search(rf"(?<![\w/]){re.escape(folder)}/", row)]
        assert found, f"the drawing leaves out {folder}/"
        row_of[f"outbox.{folder}"] = found[0]
    assert "outbox/tools/" in diagram
    for module in ROOT.glob("*.py"):
        assert module.name in diagram, f"the drawing leaves out {module.name}"
    for folder, imported in part_graph(import_graph()).items():
        for other in imported:
            if folder in row_of and other in row_of:
                assert row_of[folder] < row_of[other], f"{folder} imports {other}, drawn above it"
    named = set(re.findall(r"`?((?:_?\w+/)+_?\w+\.py)", text))
    assert len(named) > 15  # it read the page's paths
    missing = [path for path in named if not (ROOT / path).exists() and not (ROOT.parent / path).exists()]
    assert missing == [], missing


# -- one way to do each thing (#38 item 3) -----------------------------------------------------


def callers_of(name: str) -> set[str]:
    """``file:function`` of every call of ``name(...)`` (a bare name) in the library, the tools
    left out (they stand on the public API)."""
    found: set[str] = set()
    for path in sorted(ROOT.rglob("*.py")):
        if TOOLS in path.parents:
            continue
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
                    found.add(f"{path.relative_to(ROOT)}:{function.name}")
    return found


def test_events_are_serialized_in_two_places_the_intakes_batch_and_held_events():
    # The intake serializes the batch it took (its events out of the buffer), and every event
    # serialized while still held (the intake's sampling, an emitter's measure, the spill's
    # writes) goes through ``serialize_held``, put in its place by
    # ``Buffer.serialized_in_place_locked``.  A third loop of ``serialize`` with its own ``try``
    # is what #38 found five of.  Beside them, no loop: OutboxTransport writes the one event
    # it is given at emit, as openlineage-python's transports do (what it cannot write goes on
    # to emit as it was, and is counted there).
    bridge = "_bridge.py:emit"
    assert callers_of("serialize") == {
        "_worker/_intake.py:_serialize",
        "_buffer/_buffer.py:serialize_held",
        bridge,
    }
    held = {"_worker/_intake.py:serialize_in_place", "_spill/_spill.py:_write"}
    assert callers_of("serialize_held") == held
    assert len(callers_of("isinstance")) > 10  # (the scan sees the calls of a bare name)
