"""A Jupyter notebook's code cells run as a module, statement by statement (no Jupyter needed), with what the model
does not need left out and listed with its cell: shell commands and magics, statements that train, download or
read data, or save and load checkpoints, imports of packages that are not installed, and statements using what
only a left-out statement defines. Definitions are always kept; anything else that fails is an error naming the
cell. :func:`load_notebook` is what a written plugin calls."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path
from types import ModuleType

from .errors import ScaffoldError, short

ACCEPTED = "a .ipynb notebook (JSON) whose model cells run top to bottom"

SHELL = re.compile(r"^\s*[!%]")
TRAINS = re.compile(r"\bfor\s+epoch|range\([^)]*epoch|\.fit\(|\.backward\(|\.step\(|\.zero_grad\(|"
                    r"\btrain(_epoch|_model|_loop|_one_epoch)?\(|\bevaluate\(|\bTrainer\(|\.train\(\)", re.I)
DOWNLOADS = re.compile(r"urlretrieve|urlopen|requests\.(get|post)|\bwget\b|torchtext\.datasets|\bload_dataset\(|"
                       r"\.download\(|from_pretrained\(|spacy\.load|hf_hub_download|snapshot_download|\bopen\(|"
                       r"pd\.read_|\bMulti30k\b|\bIWSLT|\bWMT\d*\(|build_vocab|\.load_state_dict\(|torch\.(save|load)\(")


def _cells(path: Path) -> list[str]:
    """The code cells' sources, in order (every cell numbered as the notebook counts them, from 1)."""
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
        cells = nb["cells"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ScaffoldError(f"cannot read notebook {path.name}: {short(exc)} (accepted: {ACCEPTED})") from None
    out = []
    for cell in cells:
        src = cell.get("source", "") if isinstance(cell, dict) else ""
        text = "".join(src) if isinstance(src, list) else str(src)
        out.append(text if cell.get("cell_type") == "code" else "")
    return out


def _first_line(text: str) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= 60 else line[:57] + "..."


def _bound(node: ast.AST) -> set[str]:
    """The names a top-level statement binds."""
    names: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in n.names)
    return names


def _why_left_out(stmt: ast.stmt, source: str) -> str:
    """Why a top-level statement is left out ("" to run it)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)):
        return ""
    text = ast.get_source_segment(source, stmt) or ""
    if TRAINS.search(text):
        return "trains"
    if DOWNLOADS.search(text):
        return "downloads or reads data"
    return ""


class _Run:
    """One pass over the notebook's cells: the module they fill, and what was left out."""

    def __init__(self, path: Path, module: ModuleType):
        self.path, self.module = path, module
        self.left_out: set[str] = set()  # names only left-out statements bind
        self.cells: dict[int, list[tuple[str, str]]] = {}  # cell number -> (first line, why) of what was left out

    def note(self, cell: int, text: str, why: str) -> None:
        self.cells.setdefault(cell, []).append((_first_line(text), why))

    @property
    def notes(self) -> list[str]:
        """One line a cell: its first left-out statement, how many were left out, and why."""
        out = []
        for cell, items in self.cells.items():
            whys = list(dict.fromkeys(why for _, why in items))
            count = f" and {len(items) - 1} more statement(s)" if len(items) > 1 else ""
            out.append(f"cell {cell} `{items[0][0]}`{count}: {'; '.join(whys)}")
        return out

    def cell(self, number: int, text: str) -> None:
        if text.lstrip().startswith("%%"):
            self.note(number, text, "a cell magic")
            return
        shell = [ln for ln in text.splitlines() if SHELL.match(ln)]
        if shell:
            self.note(number, shell[0], "a shell command or magic" + (f" (and {len(shell) - 1} more)"
                                                                      if len(shell) > 1 else ""))
        code = "\n".join("pass" if SHELL.match(ln) else ln for ln in text.splitlines())
        try:
            tree = ast.parse(code, f"{self.path.name}, cell {number}")
        except SyntaxError as exc:
            raise ScaffoldError(f"notebook {self.path.name}: cell {number} does not parse: SyntaxError: {exc.msg} "
                                f"(line {exc.lineno}) (accepted: {ACCEPTED})") from None
        for stmt in tree.body:
            self.statement(number, stmt, code)

    def statement(self, number: int, stmt: ast.stmt, code: str) -> None:
        text = ast.get_source_segment(code, stmt) or ""
        why = _why_left_out(stmt, code)
        if not why:
            try:
                exec(compile(ast.Module([stmt], []), f"{self.path.name}, cell {number}", "exec"),  # noqa: S102
                     self.module.__dict__)
                return
            except ImportError as exc:
                why = f"cannot import ({short(exc)})"
            except NameError as exc:
                if getattr(exc, "name", None) not in self.left_out:
                    raise self.error(number, text, exc) from None
                why = "uses what a statement left out defines"
            except Exception as exc:  # noqa: BLE001 - the user's code: any failure is reported, naming the cell
                raise self.error(number, text, exc) from None
        self.left_out |= _bound(stmt) - set(self.module.__dict__)
        self.note(number, text, why)

    def error(self, number: int, text: str, exc: BaseException) -> ScaffoldError:
        return ScaffoldError(f"notebook {self.path.name}: cell {number} (`{_first_line(text)}`) raised {short(exc)} "
                             f"(accepted: {ACCEPTED}; cells that train, download or use the shell are left out)")


def notebook_module(notebook: str | Path) -> tuple[ModuleType, list[str]]:
    """The notebook's code cells run as a module (registered in ``sys.modules``), and one line for each thing left
    out. ScaffoldError (one line, naming the cell) when a cell that is kept fails."""
    path = Path(notebook).expanduser().resolve()
    if not path.is_file():
        raise ScaffoldError(f"cannot read notebook {notebook}: no such file (accepted: {ACCEPTED})")
    name = "aiayn_notebook_" + re.sub(r"\W", "_", path.stem)
    module = ModuleType(name, f"the code cells of {path.name}")
    module.__file__ = str(path)
    sys.modules[name] = module  # classes defined in it resolve their module (copy, pickle, the scaffold's lookups)
    run = _Run(path, module)
    try:
        for number, text in enumerate(_cells(path), 1):
            if text.strip():
                run.cell(number, text)
    except ScaffoldError:
        sys.modules.pop(name, None)
        raise
    return module, run.notes


def load_notebook(notebook: str | Path) -> ModuleType:
    """The notebook's model code as a module (what a plugin generated from a notebook imports); loaded once."""
    name = "aiayn_notebook_" + re.sub(r"\W", "_", Path(notebook).expanduser().resolve().stem)
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__file__", None) == str(Path(notebook).expanduser().resolve()):
        return module
    return notebook_module(notebook)[0]
