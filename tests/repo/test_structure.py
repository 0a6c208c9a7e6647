"""The library's shape (issue 21): no import circle among its modules at run time, and no
file, class or function too long to read in one sitting.

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
    assert "outbox._serde" in graph["outbox._intake"]  # and followed its imports
    assert circles(graph) == []


# -- sizes (issue 21): each part readable in one sitting ------------------------------------

MAX_FILE_LINES = 650
MAX_CLASS_LINES = 400
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
    assert oversized(Path("b.py"), big) == [f"b.py:1: class C of {MAX_CLASS_LINES + 1} lines (limit 400)"]
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
    """Where ``source`` writes a buffer's field (``buf.x = ...``, ``buffer.x += ...``,
    ``self.buffer.x[k] = ...``, ``buf.queue.append(...)``): outside the buffer's own modules,
    its methods are the only way to change its accounts.  A write through a local alias
    (``queue = buf.queue; queue.append(...)``) is not seen: a reviewer's to catch."""

    def is_field(node: ast.AST) -> bool:
        owner = node.value if isinstance(node, ast.Attribute) else None
        return (isinstance(owner, ast.Name) and owner.id in ("buf", "buffer")) or (
            isinstance(owner, ast.Attribute) and owner.attr == "buffer"
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
        "buf.count_locked('x', 1)\n"  # a method: allowed
        "n = buf.in_flight\n"  # a read: allowed
    )
    assert buffer_writes(Path("w.py"), source) == [
        "w.py:1: writes buf.beyond",
        "w.py:2: writes self.buffer.no_block_thread",
        "w.py:3: writes buf.room_events",
        "w.py:3: writes buf.room_bytes",
        "w.py:4: writes buf.dropped['x']",
        "w.py:5: calls buffer.queue.append",
    ]


def test_only_the_buffer_writes_its_fields():
    """#21: the worker, the outbox, the sidecar and the spill change the buffer's accounts
    through its methods only (``Buffer`` and its base ``Holdings``), which keep them whole."""
    own = {"_buffer.py", "_holdings.py"}
    paths = [path for path in sorted(ROOT.rglob("*.py")) if path.name not in own]
    assert len(paths) > 40  # it read the library
    found = [
        problem
        for path in paths
        for problem in buffer_writes(path.relative_to(ROOT.parent), path.read_text())
    ]
    assert found == [], "\n".join(found)
