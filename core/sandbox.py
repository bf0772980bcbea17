"""A Jinja sandbox with bounds, for chat templates: the one part of a model file that is a program.

Jinja's immutable sandbox refuses attribute escapes and mutation; it does not stop a template
from recursing without end, repeating a string into gigabytes or looping for hours. This
environment adds four bounds, checked before a value is built wherever its size can be known:

- **size**: no value a template builds, and not its rendered output, may print to more than
  `Bounds.text` characters (1 MiB plus twice the size of the variables it is given). A container
  counts at its printed size, so sharing one string a million times does not hide it.
- **time**: `Bounds.seconds` of wall time, checked at every loop iteration, call, filter,
  operator and output chunk; every single step between checks is bounded by the size bound.
- **depth**: `Bounds.depth` nested calls (macros, `loop()` recursion, methods), well below
  Python's recursion limit.
- **numbers**: integers of at most `Bounds.int_bits` bits.

A template that passes a bound raises `TemplateRefused`, whose message says what it did.
"""

from __future__ import annotations

import inspect
import re
import string
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import wraps

from jinja2 import nodes
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer

MIB = 1 << 20


class TemplateRefused(Exception):
    """A template passed a bound; the message completes "the template ..."."""


@dataclass(frozen=True)
class Bounds:
    text: int = MIB  # characters any value or the output may print to
    seconds: float = 1.0
    depth: int = 48  # nested calls; each costs Python about eight frames
    int_bits: int = 1 << 16
    source: int = 256 * 1024  # characters of template text (the biggest real ones are ~40 KB)


def shape(value, budget: int) -> tuple[int, int]:
    """(printed size, nesting depth) of `value`, counting stopped once the size passes `budget`.
    Shared parts count each time they would print; containers count their brackets and commas."""
    size, depth, stack = 0, 0, [(value, 1)]
    while stack and size <= budget:
        item, level = stack.pop()
        depth = max(depth, level)
        if isinstance(item, (str, bytes)):
            size += len(item)
            continue
        if isinstance(item, bool) or item is None:
            size += 5
            continue
        if isinstance(item, int):
            size += item.bit_length() // 3 + 1
            continue
        if isinstance(item, Namespace):
            item = _namespace_attrs(item)
        if isinstance(item, dict):
            size += 2 + 4 * len(item)
            if size <= budget:
                stack.extend((x, level + 1) for pair in item.items() for x in pair)
        elif isinstance(item, (list, tuple, set, frozenset)):
            size += 2 + 2 * len(item)
            if size <= budget:
                stack.extend((x, level + 1) for x in item)
        else:
            size += 8  # a number, a macro, a loop: short to print
    return size, depth


def text_size(value, budget: int) -> int:
    return shape(value, budget)[0]


def _namespace_attrs(ns: Namespace) -> dict:
    try:  # Jinja keeps a namespace's values in a private dict
        return dict(object.__getattribute__(ns, "_Namespace__attrs"))
    except AttributeError:
        return {}


# ---- size estimates of the operations that multiply -----------------------------------------

_PERCENT_FIELD = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")


def _number(text: str, star: int) -> int:
    if text == "*":
        return star
    return int(text) if len(text) < 10 else 1 << 40


def _largest_int(args) -> int:
    values = args.values() if isinstance(args, dict) else args if isinstance(args, (list, tuple)) else [args]
    return max((abs(v) for v in values if isinstance(v, int)), default=0)


def percent_size(fmt: str, args, budget: int) -> int:
    """An upper bound of `fmt % args`: each field prints at most all of `args` plus its width and precision."""
    arg_size, star = text_size(args, budget), _largest_int(args)
    total = len(fmt)
    for width, precision in _PERCENT_FIELD.findall(fmt):
        total += arg_size + _number(width or "0", star) + _number(precision or "0", star)
        if total > budget:
            break
    return total


def format_size(fmt: str, args: tuple, kwargs: dict, budget: int) -> int:
    """An upper bound of `fmt.format(*args, **kwargs)`: each field prints at most all the arguments
    plus the numbers of its format spec (or the largest integer argument for a nested field)."""
    arg_size = text_size((args, kwargs), budget)
    star = max(_largest_int(args), _largest_int(kwargs))
    total = len(fmt)
    for _, field, spec, _ in string.Formatter().parse(fmt):
        if field is None:
            continue
        total += arg_size + sum(_number(n, star) for n in re.findall(r"\d+", spec or "")) + ("{" in (spec or "")) * star
        if total > budget:
            break
    return total


def _str_method_size(method, args: tuple, kwargs: dict, budget: int) -> int | None:
    """An upper bound of what a str/bytes method returns, for the methods whose result can be far
    bigger than the string and their arguments; None for the others."""
    s, name = method.__self__, method.__name__
    if name not in _GROWING_METHODS:
        return None
    try:
        call = inspect.signature(method).bind(*args, **kwargs).arguments
    except TypeError:  # the method itself says what is wrong with its arguments
        return None
    if name in ("ljust", "rjust", "center", "zfill"):
        return len(s) + max(call.get("width", 0), 0)
    if name == "expandtabs":
        return len(s) + s.count("\t" if isinstance(s, str) else b"\t") * max(call.get("tabsize", 8), 0)
    if name == "join":
        items = call["iterable"]
        return text_size(items, budget) + len(s) * len(items)
    if name == "replace":
        return replace_size(s, call["old"], call["new"], call.get("count", -1))
    if name == "translate":
        table = call["table"]
        longest = max((text_size(v, budget) for v in table.values()), default=1) if isinstance(table, dict) else 1
        return len(s) * max(longest, 1)
    return None


_GROWING_METHODS = ("ljust", "rjust", "center", "zfill", "expandtabs", "join", "replace", "translate")


def replace_size(s, old, new, count: int = -1) -> int:
    hits = (s.count(old) if old else len(s) + 1)
    if count is not None and count >= 0:
        hits = min(hits, count)
    return len(s) + hits * max(len(new) - len(old), 0)


# builtin filters whose result can be far bigger than their arguments (none is wrapped by Jinja
# in a way that hides its signature)
_GROWING_FILTERS = ("join", "replace", "indent", "wordwrap", "center", "format", "tojson", "sum", "batch", "slice")


def _filter_size(name: str, call: dict, budget: int) -> int | None:
    """An upper bound of what a builtin filter returns, for the filters that can multiply."""
    if name == "join":
        items = call["value"]
        return text_size(items, budget) + len(str(call.get("d", ""))) * len(items)
    if name == "replace":
        return replace_size(str(call["s"]), str(call["old"]), str(call["new"]), call.get("count"))
    if name == "indent":
        s, width = str(call["s"]), call.get("width", 4)
        return len(s) + (s.count("\n") + 1) * (len(width) if isinstance(width, str) else max(int(width), 0))
    if name == "wordwrap":
        s = str(call["s"])
        return len(s) + (len(s) + 1) * len(call.get("wrapstring") or "\n")
    if name == "center":
        return len(str(call["value"])) + max(int(call.get("width", 80)), 0)
    if name == "format":
        args = call.get("kwargs") or call.get("args", ())
        return percent_size(str(call["value"]), args, budget)
    if name == "tojson":
        size, depth = shape(call["value"], budget)
        indent = call.get("indent")
        step = len(indent) if isinstance(indent, str) else int(indent or 0)
        return 6 * size + size * depth * step
    if name == "sum":  # adding lists copies the sum so far at every step
        items, start = call["iterable"], call.get("start", 0)
        if not any(isinstance(x, (list, tuple)) for x in (start, *items)):
            return None
        return text_size(items, budget) * max(len(items), 1) + text_size(start, budget)
    if name in ("batch", "slice"):  # as many fill values as the count asks
        return int(call.get("linecount", call.get("slices", 0)))
    return None


# ---- the environment --------------------------------------------------------------------------

def _env_call(attribute: str, *args: nodes.Expr, like: nodes.Node) -> nodes.Call:
    call = nodes.Call(nodes.EnvironmentAttribute(attribute), list(args), [], None, None)
    call.set_lineno(like.lineno)
    return call.set_environment(like.environment) if like.environment is not None else call


class _Checkpoints(NodeTransformer):
    """Routes what the sandbox cannot intercept through the environment: every loop's iterable,
    every `~` concatenation and every list, tuple or dict literal."""

    def visit_For(self, node: nodes.For) -> nodes.For:
        self.generic_visit(node)
        node.iter = _env_call("checked_iter", node.iter, like=node)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Call:
        self.generic_visit(node)
        parts = nodes.List(node.nodes, lineno=node.lineno)
        return _env_call("checked_concat", parts, like=node)

    def _sized(self, node: nodes.Expr) -> nodes.Call:
        self.generic_visit(node)
        return _env_call("checked_value", node, like=node)

    visit_List = visit_Dict = _sized

    def visit_Tuple(self, node: nodes.Tuple) -> nodes.Node:
        return self._sized(node) if node.ctx == "load" else self.generic_visit(node)


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox plus the bounds above; one render at a time (`render`)."""

    intercepted_binops = frozenset({"+", "*", "%", "**"})

    def __init__(self, bounds: Bounds = Bounds(), **options):
        super().__init__(finalize=self.checked_output, **options)
        self.bounds = bounds
        self.limit, self.deadline, self.depth, self.printed = bounds.text, float("inf"), 0, 0
        self.concat = self.checked_join  # joins every captured block and macro body
        self.globals.pop("lipsum", None)  # lorem ipsum with a size argument; no template needs it
        self.filters = {name: self._guarded_filter(name, f) for name, f in self.filters.items()}

    # ---- rendering -------------------------------------------------------------------------

    def render(self, source: str, **variables) -> str:
        if len(source) > self.bounds.source:
            raise TemplateRefused(f"is {len(source)} characters long, more than the {self.bounds.source} allowed")
        self.limit = self.bounds.text + 2 * text_size(variables, 1 << 40)
        self.deadline, self.depth, self.printed = time.monotonic() + self.bounds.seconds, 0, 0
        tree = _Checkpoints().visit(self.parse(source))
        chunks, size = [], 0
        for chunk in self.from_string(tree).generate(**variables):
            size += len(chunk)
            self._check(size, "in its output")
            chunks.append(chunk)
        return "".join(chunks)

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateRefused(f"ran past its time limit of {self.bounds.seconds:g} s")

    def _check(self, size: int, how: str, limit: int | None = None) -> None:
        self.tick()
        limit = limit or self.limit
        if size > limit:
            raise TemplateRefused(f"would build more than {_amount(limit)} of text {how} (the most a template may)")

    # ---- checkpoints the compiled template calls ----------------------------------------

    def checked_value(self, value):
        self._check(text_size(value, self.limit), "in one value")
        return value

    def checked_output(self, value):
        """Every `{{ ... }}`, also inside macros and blocks whose text is captured rather than
        output: what all of them print together is bounded too, so a capture cannot pile up."""
        size = text_size(value, self.limit)
        self._check(size, "in one value")
        self.printed += size
        self._check(self.printed, "in all it prints (captured blocks included)", 4 * self.limit)
        return value

    def checked_concat(self, parts: list) -> str:
        self._check(text_size(parts, self.limit), "by concatenating with ~")
        return "".join(map(str, parts))

    def checked_join(self, parts) -> str:
        parts = list(parts)
        self._check(sum(len(p) for p in parts), "in a macro or block")
        return "".join(parts)

    def checked_iter(self, iterable):
        return _TickingIterable(self, iterable)

    def collect(self, items: Iterator) -> list:
        """A lazy sequence made a list, refused as soon as it would print past the limit."""
        out, size = [], 2
        for item in items:
            size += text_size(item, self.limit) + 2
            self._check(size, "by collecting a sequence")
            out.append(item)
        return out

    def _materialized(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        lazy = lambda v: isinstance(v, Iterator) and not isinstance(v, LoopContext)  # noqa: E731
        args = tuple(self.collect(a) if lazy(a) else a for a in args)
        return args, {k: self.collect(v) if lazy(v) else v for k, v in kwargs.items()}

    # ---- the sandbox's hooks ----------------------------------------------------------------

    def call_binop(self, context, operator: str, left, right):
        self.tick()
        if operator == "+" and isinstance(left, (str, bytes, list, tuple)) and type(left) is type(right):
            self._check(text_size(left, self.limit) + text_size(right, self.limit), "by adding")
        elif operator == "*":
            self._check_product(left, right)
        elif operator == "%" and isinstance(left, str):
            self._check(percent_size(left, right, self.limit), "by formatting with %")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
            self._check_bits(right * left.bit_length())
        return super().call_binop(context, operator, left, right)

    def _check_product(self, left, right) -> None:
        if isinstance(left, int) and isinstance(right, int):
            self._check_bits(left.bit_length() + right.bit_length())
            return
        sequence, times = (left, right) if isinstance(right, int) else (right, left)
        if isinstance(times, int) and isinstance(sequence, (str, bytes, list, tuple)):
            self._check(text_size(sequence, self.limit) * max(times, 0), "by repeating a value")

    def _check_bits(self, bits: int) -> None:
        self.tick()
        if bits > self.bounds.int_bits:
            raise TemplateRefused(f"would compute an integer of about {bits} bits "
                                  f"(the limit is {self.bounds.int_bits})")

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805  (the sandbox's own signature)
        self = __self
        self.tick()
        args, kwargs = self._materialized(args, kwargs)
        if inspect.isbuiltin(__obj) and isinstance(getattr(__obj, "__self__", None), (str, bytes)):
            own = {k: v for k, v in kwargs.items() if k not in ("_loop_vars", "_block_vars")}  # Jinja's own
            estimate = _str_method_size(__obj, args, own, self.limit)
            if estimate is not None:
                self._check(estimate, f"with .{__obj.__name__}()")
        self.depth += 1
        try:
            if self.depth > self.bounds.depth:
                raise TemplateRefused(f"nested calls more than {self.bounds.depth} deep "
                                      "(a macro or a loop recursing without end)")
            result = super().call(__context, __obj, *args, **kwargs)
        finally:
            self.depth -= 1
        return self.checked_value(result)

    def wrap_str_format(self, value):
        sandboxed = super().wrap_str_format(value)
        if sandboxed is None:
            return None
        fmt, name = value.__self__, value.__name__

        def checked(*args, **kwargs):
            fields = (args, kwargs) if name == "format" else ((), args[0] if args else {})
            self._check(format_size(fmt, *fields, self.limit), f"with .{name}()")
            return sandboxed(*args, **kwargs)
        return checked

    def _guarded_filter(self, name: str, func):
        signature = inspect.signature(func)

        @wraps(func)
        def guarded(*args, **kwargs):
            self.tick()
            args, kwargs = self._materialized(args, kwargs)
            if name in _GROWING_FILTERS:
                try:
                    call = signature.bind(*args, **kwargs)
                except TypeError:  # the filter itself says what is wrong with its arguments
                    return func(*args, **kwargs)
                estimate = _filter_size(name, _flat(call.arguments), self.limit)
                if estimate is not None:
                    self._check(estimate, f"with the {name} filter")
            return self.checked_value(func(*args, **kwargs))
        return guarded


def _flat(arguments: dict) -> dict:
    """A filter's bound arguments with **kwargs spread out, as the size estimates read them."""
    extra = arguments.pop("kwargs", None)
    return {**arguments, **(extra or {}), "kwargs": extra}


class _TickingIterable:
    """A loop's iterable that checks the clock at every item; sized when what it wraps is."""

    def __init__(self, env: BoundedEnvironment, iterable):
        self.env, self.iterable = env, iterable

    def __len__(self) -> int:
        return len(self.iterable)

    def __iter__(self):
        for item in self.iterable:
            self.env.tick()
            yield item


def _amount(chars: int) -> str:
    return f"{chars / MIB:.1f} MiB" if chars >= MIB else f"{chars // 1024} KiB"
