"""Function documents: the corpus's documented Python functions, each after the imports it uses, as HumanEval's are.

A HumanEval problem is a short module: imports, then one function whose signature and docstring say what it does,
then its body. The corpus's whole files are mostly other things (classes, configuration, long modules), so a run
told `--functions` trains on documents cut to that shape instead:

    module.py -> the imports it uses + "\\n\\n\\n" + one top-level function (decorators, signature, docstring, body)

A function is taken when it has a docstring and a body after it of 1 to `max_body_lines` lines, and is not a test
(`test...`: HumanEval's functions are library code). Of the module's top-level imports only the names the function
uses are kept (`from typing import List` of a long `from typing import (...)`), so that the context is the function,
as HumanEval's is, and not a page of imports. Functions whose text is the same (a helper copied between packages) are
kept once. The corpus has already dropped every file that shares text with the benchmark, so nothing cut from it does.
"""

from __future__ import annotations

import ast
import hashlib
import logging
from typing import Iterable, Iterator

from infill_engine.training.corpus import Document

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_LINES = 30  # HumanEval's canonical bodies are 1 to 30 lines long, most under 12


def functions_to_train_on(documents: list[Document],
                          share: float = 1.0) -> tuple[list[Document], list[float] | None]:
    """The documents and draw weights of a `--functions` run: the training files' `function_documents`, drawn for
    `share` of the examples (the files themselves for the rest, each pool in proportion to length); a ValueError
    saying what there was when no function qualifies."""
    if not 0 < share <= 1:
        raise ValueError(f"the share of function documents must be in (0, 1] (got {share!r})")
    functions = function_documents(documents)
    if not functions:
        python = sum(d.path.endswith(".py") for d in documents)
        raise ValueError(f"--functions found no top-level Python function with a docstring and 1 to "
                         f"{DEFAULT_MAX_BODY_LINES} lines of body in the {len(documents)} training files "
                         f"({python} of them Python)")
    if share == 1:
        logger.info("training on %d documented functions cut from %d training files", len(functions), len(documents))
        return functions, None
    logger.info("training on %d documented functions cut from %d training files for %.0f%% of the examples, on the "
                "files themselves for the rest", len(functions), len(documents), 100 * share)
    return documents + functions, _pool_weights(documents, 1 - share) + _pool_weights(functions, share)


def _pool_weights(documents: list[Document], share: float) -> list[float]:
    """Draw weights in proportion to length, summing to `share`."""
    total = sum(len(d.text) for d in documents) or 1
    return [share * len(d.text) / total for d in documents]


def function_documents(documents: Iterable[Document],
                       max_body_lines: int = DEFAULT_MAX_BODY_LINES) -> list[Document]:
    """One document per documented top-level function of the Python documents, in corpus order, without repeats."""
    if max_body_lines < 1:
        raise ValueError(f"max_body_lines must be at least 1 (got {max_body_lines})")
    seen: set[str] = set()
    chosen: list[Document] = []
    for document in documents:
        if not document.path.endswith(".py"):
            continue
        for function in _documented_functions(document, max_body_lines):
            if function.sha256 not in seen:
                seen.add(function.sha256)
                chosen.append(function)
    return chosen


def _documented_functions(document: Document, max_body_lines: int) -> Iterator[Document]:
    """The documented top-level functions of one Python file that are not tests, each after the imports it uses."""
    # ast counts lines at \n, \r\n and \r only (str.splitlines also splits at form feeds and other separators)
    source = document.text.replace("\r\n", "\n").replace("\r", "\n")
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # not Python this interpreter reads (Python 2, templates, NUL bytes)
        return
    lines = source.split("\n")
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or ast.get_docstring(node) is None:
            continue
        if node.name.startswith("test"):
            continue
        body = node.body[1:]  # the statements after the docstring
        if not body or not 1 <= body[-1].end_lineno - body[0].lineno + 1 <= max_body_lines:
            continue
        first = min([node.lineno] + [decorator.lineno for decorator in node.decorator_list])
        function = "\n".join(lines[first - 1:node.end_lineno]) + "\n"
        used = _imports_used(imports, node)
        text = f"{used}\n\n\n{function}" if used else function
        yield Document(
            path=f"{document.path}::{node.name}",
            text=text,
            sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
            split=document.split,
        )


def _imports_used(imports: list[ast.Import | ast.ImportFrom], function: ast.AST) -> str:
    """The import statements cut down to the names `function` reads, one statement a line, in the module's order."""
    names = {n.id for n in ast.walk(function) if isinstance(n, ast.Name)}
    statements = []
    for statement in imports:
        aliases = [alias for alias in statement.names
                   if (alias.asname or alias.name.split(".")[0]) in names]
        if not aliases:
            continue
        if isinstance(statement, ast.Import):
            statements.append(ast.unparse(ast.Import(names=aliases)))
        else:
            statements.append(ast.unparse(ast.ImportFrom(module=statement.module, names=aliases,
                                                         level=statement.level)))
    return "\n".join(statements)
