"""docs/ARCHITECTURE.md stays true: every module, folder, class, function, method, constant and configuration key
it names in backticks exists in the code.

How a backticked name is read (anything else — a command, a topic pattern, a table key, a word — is prose):

- ``a/b.py``, ``b.py``, ``pages_*.py``, ``dashboard.css``: a file of the repository whose path ends so; ``a/b/``:
  a folder.
- ``Name.attr``, ``module.Name.attr``, ``package.module.func``: resolved part by part over the repository's
  packages, modules and classes (a class's methods, class attributes, dataclass fields and ``self.x``
  attributes, inherited ones too); a first part that is none of them (``asyncio.Lock``) is another project's; a
  dotted string the code holds (``lifecycle.purges``, a key) or writes as an expression (``context.write``, a
  parameter's method) is there too.
- ``CamelCase``, ``snake_case``, ``_private``, ``UPPER_CASE``: defined somewhere in the code (a class, function,
  method, attribute or assigned name), a message or RPC of the gRPC protocol's .proto files, or a string the
  code holds (a topic name such as ``RMQ_SYS_TRANS_HALF_TOPIC``).
- ``lowerCamelCase``: a configuration key (``BrokerConfig``, ``NamesrvConfig``), or a field of a request the code
  reads or a string it holds (a JSON field of the wire: ``brokerAddrs``).

A call written with its arguments (``submit(op)``, ``Dispatcher.drain(shutdownGraceSeconds)``) names the callee.
"""
from __future__ import annotations

import ast
import fnmatch
import re
from dataclasses import fields
from functools import cache
from pathlib import Path

import pytest

from halfmq.broker.config import BrokerConfig
from halfmq.broker.namesrv.config import NamesrvConfig

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "ARCHITECTURE.md"
#: the folders pyproject maps onto ``halfmq.<package>`` (the import name's first part is ``halfmq``)
PACKAGES = ("protocol", "transactions", "store", "broker", "client", "pipeline", "dashboard")
#: what the map may name besides the packages: the test harness (``EtcdCluster``) and the scripts
OTHER_CODE = ("tests", "scripts")
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


class Index:
    """What the code defines: modules and packages by dotted path, each scope's names, every name anywhere."""

    def __init__(self) -> None:
        self.scopes: dict[str, set[str]] = {}  #: "broker.server" / "broker.server.Broker" → names defined in it
        self.bases: dict[str, list[str]] = {}  #: "broker.server.Broker" → the names of its base classes
        self.sources: list[str] = []
        self.anywhere: set[str] = set()
        self.strings: set[str] = set()
        self.files = sorted(str(p.relative_to(REPO)) for p in REPO.rglob("*")
                            if not {".venv", ".git", ".peers", "node_modules"} & set(p.relative_to(REPO).parts))
        self.folders = {str(Path(f).parent) + "/" for f in self.files}
        for package in PACKAGES + OTHER_CODE:
            for path in sorted((REPO / package).rglob("*.py")):
                if path == Path(__file__).resolve():
                    continue  # its own examples of names that are not there
                rel = path.relative_to(REPO).with_suffix("")
                parts = list(rel.parts[:-1]) if rel.name == "__init__" else list(rel.parts)
                for depth in range(1, len(parts)):
                    self.scopes.setdefault(".".join(parts[:depth]), set()).add(parts[depth])
                self.sources.append(path.read_text())
                self._module(".".join(parts), ast.parse(self.sources[-1], str(path)))
        for proto in (REPO / "broker").rglob("*.proto"):  # the gRPC messages and RPCs the endpoint serves
            self.anywhere.update(re.findall(r"^\s*(?:message|enum|rpc)\s+(\w+)", proto.read_text(), re.M))

    def _module(self, name: str, tree: ast.Module) -> None:
        self._scope(name, tree.body)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                self.strings.add(node.value)
            elif isinstance(node, ast.Attribute):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls") \
                        and isinstance(node.ctx, ast.Store):
                    self.anywhere.add(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.anywhere.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                self.anywhere.add(node.id)

    def _scope(self, name: str, body: list[ast.stmt]) -> None:
        names = self.scopes.setdefault(name, set())
        for node in body:
            for defined in _defined(node):
                names.add(defined)
                self.anywhere.add(defined)
            if isinstance(node, ast.ClassDef):
                self._scope(f"{name}.{node.name}", node.body)
                self.bases[f"{name}.{node.name}"] = [b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                                                     if isinstance(b, (ast.Name, ast.Attribute))]
                attrs = self.scopes[f"{name}.{node.name}"]
                for inner in ast.walk(node):  # self.x = ... in its methods
                    if isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Store) \
                            and isinstance(inner.value, ast.Name) and inner.value.id == "self":
                        attrs.add(inner.attr)
            elif isinstance(node, (ast.If, ast.Try)):  # a name defined under a condition (optional imports)
                self._scope(name, [n for n in ast.iter_child_nodes(node) if isinstance(n, ast.stmt)])

    def resolve(self, dotted: str) -> bool | None:
        """True when every part resolves, False when the first does and a later one does not, None when the
        first part is none of the repository's (another project's name)."""
        parts = dotted.split(".")
        if parts[0] == "halfmq":
            parts = parts[1:]
        starts = [s for s in self.scopes if s == parts[0] or s.endswith("." + parts[0])]
        if not starts:
            return None
        return any(self._walk(start, parts[1:]) for start in starts)

    def _walk(self, scope: str, rest: list[str]) -> bool:
        if not rest:
            return True
        if rest[0] not in self.scopes.get(scope, ()):
            # inherited: a class's bases, found by their names
            return any(self._walk(base, rest) for name in self.bases.get(scope, ())
                       for base in self.scopes if base.endswith("." + name) and base in self.bases)
        inner = f"{scope}.{rest[0]}"
        return len(rest) == 1 or (inner in self.scopes and self._walk(inner, rest[1:]))

    def used(self, dotted: str) -> bool:
        """Whether the code writes ``dotted`` as an expression (``context.write``: a parameter's method)."""
        pattern = re.compile(rf"(?<![\w.]){re.escape(dotted)}\b")
        return any(pattern.search(source) for source in self.sources)


def _defined(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [n.id for target in node.targets for n in ast.walk(target) if isinstance(n, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(alias.asname or alias.name).split(".")[0] for alias in node.names]
    return []


@cache
def index() -> Index:
    return Index()


CONFIG_KEYS = {f.name for cls in (BrokerConfig, NamesrvConfig) for f in fields(cls)}


def named() -> list[str]:
    """Each distinct backticked span of the document, a call's arguments dropped."""
    spans = re.findall(r"`([^`\n]+)`", DOC.read_text())
    return sorted({re.sub(r"\(.*\)$", "", span.strip()) for span in spans})


def problem(name: str) -> str | None:
    """Why ``name`` is not in the code, or None when it is (or is not a name of code)."""
    code = index()
    if re.fullmatch(r"[\w/*.-]+\.(py|css|js|html|md|yml|proto|toml|sh|conf)", name):
        found = any(fnmatch.fnmatch(f, name) or fnmatch.fnmatch(f, "*/" + name) for f in code.files)
        return None if found else "no such file"
    if re.fullmatch(r"[\w.-]+(/[\w.-]+)*/", name):
        found = any(f == name or f.endswith("/" + name) for f in code.folders)
        return None if found else "no such folder"
    if re.fullmatch(rf"{IDENT}(\.{IDENT})+", name):
        if code.resolve(name) is not False or name in code.strings or code.used(name):
            return None
        return "not defined there"
    if not re.fullmatch(IDENT, name):
        return None  # prose: a command, a pattern, an expression
    if re.fullmatch(r"[a-z][a-z0-9]*([A-Z][a-z0-9]*)+", name):  # lowerCamelCase
        if name in CONFIG_KEYS or name in code.strings or code.used(name):
            return None
        return "no such configuration key or field"
    if "_" in name or name[0].isupper():
        if name in code.anywhere or name in code.strings:
            return None
        return "defined nowhere"
    return None  # a lower-case word: a table, a field, prose


def test_every_name_it_gives_exists():
    missing = [f"`{name}`: {why}" for name in named() if (why := problem(name)) is not None]
    assert not missing, "docs/ARCHITECTURE.md names what the code does not have:\n" + "\n".join(missing)


@pytest.mark.parametrize("name", ["store/nowhere.py", "processors/", "Broker.no_such_method",
                                  "ProducerService.check_nothing", "halfmq.broker.server.NoSuchThing",
                                  "NoSuchClass", "no_such_function", "NO_SUCH_LIMIT", "noSuchConfigKey"])
def test_a_name_that_is_not_there_is_found(name):
    if name == "processors/":
        assert problem(name) is None and problem("nowhere/") is not None
    else:
        assert problem(name) is not None, name


def imports(lazy: bool = True) -> dict[str, set[str]]:
    """Each module of the packages → the modules of the packages it imports: at import time, and with ``lazy``
    inside functions too; imports under ``if TYPE_CHECKING`` are for annotations and left out. Modules are dotted
    paths from the repository root (``broker.server``)."""
    modules = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        skipped = {id(node) for block in ast.walk(tree) for node in ast.walk(block)
                   if (isinstance(block, ast.If) and isinstance(block.test, ast.Name)
                       and block.test.id == "TYPE_CHECKING")
                   or (not lazy and isinstance(block, (ast.FunctionDef, ast.AsyncFunctionDef)))}
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                targets.update(alias.name.removeprefix("halfmq.") for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = (node.module or "").removeprefix("halfmq.")
                subs = {f"{base}.{alias.name}" for alias in node.names} & modules.keys()
                targets.update(subs)
                if len(subs) < len(node.names):
                    targets.add(base)
        graph[name] = (targets & modules.keys()) - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[str]:
    found: list[str] = []
    done: set[str] = set()

    def visit(module, path):
        for target in sorted(graph[module]):
            if target in path:
                found.append(" → ".join(path[path.index(target):] + [target]))
            elif target not in done:
                visit(target, path + [target])
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    return sorted(set(found))


def test_no_module_imports_itself_back_at_import_time():
    found = cycles(imports(lazy=False))
    assert not found, "import cycles:\n" + "\n".join(found)


def test_the_command_line_and_the_cluster_command_do_not_import_each_other():
    """Not even lazily: both take the event loop from broker/loop.py."""
    graph = imports()
    assert "broker.local_cluster" not in graph["broker.cli"] or "broker.cli" not in graph["broker.local_cluster"]
    assert not [c for c in cycles(graph) if "broker.cli" in c.split(" → ")], cycles(graph)


def test_only_the_command_line_builds_a_broker():
    """broker/server.py is the composition root: what it builds (the name server, the services) never imports it."""
    users = sorted(module for module, targets in imports().items() if "broker.server" in targets)
    assert users == ["broker.cli"], users


#: Where refusals are raised: the adapters, and the components under them that refuse requests themselves.
REFUSING = ("broker/processors", "broker/grpc", "broker/acl.py", "broker/names.py", "broker/topics.py",
            "broker/namesrv/processor.py", "broker/replication/member.py", "broker/services/long_poll.py")
#: What may take a remoting response code: building an answer.
ANSWERING = {"response", "RemotingCommand"}


def _failure_params(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The parameters of ``function`` annotated ``Failure``: a row the caller picked."""
    arguments = function.args.posonlyargs + function.args.args + function.args.kwonlyargs
    return {a.arg for a in arguments if isinstance(a.annotation, ast.Name) and a.annotation.id == "Failure"}


def _raw_refusals(path: Path) -> list[int]:
    """The lines of ``path`` raising a ``BrokerError`` with anything but ``Failure.X`` or a parameter typed
    ``Failure``."""
    lines = []
    for function in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        rows = _failure_params(function)
        for node in ast.walk(function):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "BrokerError"
                    and node.args):
                continue
            first = node.args[0]
            if not ((isinstance(first, ast.Attribute) and isinstance(first.value, ast.Name)
                     and first.value.id == "Failure") or (isinstance(first, ast.Name) and first.id in rows)):
                lines.append(node.lineno)
    return sorted(set(lines))


def _raw_codes_passed(path: Path) -> list[int]:
    """The lines of ``path`` handing a ``ResponseCode.X`` to anything but an answer's builder: a refusal's code
    picked where it is raised (``check_message_key(key, "key", ResponseCode.SYSTEM_ERROR)``)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) in ANSWERING:
            continue
        for value in [*node.args, *(keyword.value for keyword in node.keywords)]:
            if (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)
                    and value.value.id in ("ResponseCode", "R")):
                lines.append(node.lineno)
    return sorted(set(lines))


def test_adapters_refuse_through_the_error_table():
    """The remoting and gRPC adapters, and the components that refuse requests under them (access control, name
    rules, topics, the name server, a replication group's member, the long polls' bounds), raise
    ``BrokerError(Failure.X, ...)`` and hand a name check a ``Failure`` row: each refusal is a row of the one error
    table (broker/errors.py), never a response code picked where it is raised."""
    raw = []
    for where in REFUSING:
        target = REPO / where
        for path in sorted(target.rglob("*.py")) if target.is_dir() else [target]:
            lines = sorted({*_raw_refusals(path), *_raw_codes_passed(path)})
            raw += [f"{path.relative_to(REPO)}:{line}" for line in lines]
    assert not raw, "refusals with a raw code:\n" + "\n".join(raw)
