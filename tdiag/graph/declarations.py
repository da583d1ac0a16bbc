"""Declarations: the builder's first stages. Sizes (`size D = F / H`, overrides from --set, cycles,
whole positive values under the limit) and declared tensors (inputs, params, consts, buffers, masks,
random nodes): their axes bind legs to sizes, and their initializers are checked against what each
kind takes."""

from __future__ import annotations

import networkx as nx
import sympy

from .. import parse as syn
from ..errors import did_you_mean, one_of
from ..errors import hint as join_hint
from ..ir import Axis, Init, Leg, Size, Tensor
from .model import LIMITS
from .sizes import SizeTable, expand_sizes, number_text, size_symbol, size_values
from .syntax import call_parts, syntax_cycles
from .vocabulary import INIT_PARAMS, INITIALIZERS, POISON_SIZE, RANDOM_MODES


class Declarations:
    """Sizes and declared tensors, a base class of DesignBuilder (builder.py), whose attributes and
    bind_leg/scalar_of it uses."""

    head: syn.DesignDecl
    items: list[syn.Item]
    overrides: dict[str, int]
    sizes: SizeTable
    legs: dict[str, Leg]
    tensors: dict[str, Tensor]
    runtime_sizes: set[sympy.Symbol]

    # -- sizes --
    def _declare_sizes(self) -> None:
        defs = [i for i in self.items if isinstance(i, syn.SizeDef)]
        names = {d.name for d in defs}
        for key in self.overrides:
            if key not in names:
                self.error(
                    f"design '{self.head.name}' has no size '{key}'",
                    hint=join_hint(did_you_mean(key, names), f"its sizes are: {', '.join(sorted(names))}"),
                )
        self.runtime_sizes = {size_symbol(d.name) for d in defs if d.value is None and d.name not in self.overrides}
        for d in defs:
            symbol = size_symbol(d.name)
            if d.name in self.overrides:
                definition: sympy.Expr | None = sympy.Integer(self.overrides[d.name])
            elif d.value is None:
                definition = None
            else:
                definition = self.scalar_of(d.value, sizes_only=True, known=names)
            self.sizes[d.name] = Size(d.name, symbol, definition, d.span)
        self._check_size_cycles()
        self._check_size_values()

    def _check_size_cycles(self) -> None:
        deps = nx.DiGraph()
        for s in self.sizes.values():
            deps.add_node(s.name)
            for sym in s.definition.free_symbols if s.definition is not None else ():
                deps.add_edge(s.name, str(sym))
        for cycle in syntax_cycles(deps, list(self.sizes)):
            spans = [self.sizes[n].span for n in cycle if n in self.sizes]
            self.error("sizes defined in a cycle: " + " -> ".join([*cycle, cycle[0]]), *spans)
            for n in cycle:
                s = self.sizes[n]
                self.sizes[n] = Size(n, s.symbol, None, s.span)

    def _check_size_values(self) -> None:
        values = size_values(self.sizes)
        for name, value in values.items():
            size = self.sizes[name]
            if value.is_integer and value > LIMITS.max_size:  # type: ignore[operator]
                self.error(
                    f"size {name} = {number_text(value)} is over the limit of {LIMITS.max_size:,}",
                    size.span,
                    hint="sizes are tensor dimensions; the limit is tdiag.LIMITS.max_size (TDIAG_MAX_SIZE)",
                )
                continue
            if value.is_integer and value > 0:  # type: ignore[attr-defined]
                continue
            definition = size.definition if size.definition is not None else sympy.S.Zero
            if definition.is_Rational and not definition.is_integer and value > 0:
                written = repr(float(value))
                self.error(
                    f"size {name} = {written} is not a whole number; a size must be a whole positive number",
                    size.span,
                    hint=f"a real constant (a RoPE base, say) goes into the statements as a number: log({written})",
                )
                continue
            shown = ", ".join(
                f"{k}={v}"
                for k, v in values.items()
                if k != name and sympy.Symbol(k, positive=True) in (size.definition or sympy.S.Zero).free_symbols
            )
            self.error(
                f"size {name} = {size.definition} is {number_text(value)}"
                + (f" at {shown}" if shown else "")
                + "; a size must be a whole positive number",
                size.span,
                hint="choose sizes that divide evenly" if "/" in str(size.definition) else None,
            )

    # -- declarations --
    def _declare_tensors(self) -> None:
        values = size_values(self.sizes)  # the sizes are all declared: their numbers are fixed
        for d in (i for i in self.items if isinstance(i, syn.Declaration)):
            axes = []
            for axis in d.axes:
                size = self.scalar_of(axis.size, sizes_only=True)
                self._check_axis_size(d, axis, size, values)
                self.bind_leg(axis.leg, size, axis.span, d.name)
                axes.append(Axis(axis.leg, size))
            self._check_axis_names(d)
            self._check_stored_size(d, tuple(axes))
            init = self._initializer(d, tuple(axes))
            tensor = Tensor(d.name, d.kind, tuple(axes), d.name_span, init=init)
            tensor.is_constant = d.kind == "const"
            self.tensors[d.name] = tensor

    def _check_axis_size(self, d: syn.Declaration, axis: syn.Axis, size: sympy.Expr, values: dict) -> None:
        """An axis written with its own size formula (`g: F - 1`) is held to the rules of a named
        size: a whole positive number within the limit, wherever its sizes (`values`) are known."""
        reported = {size_symbol(name) for name, value in values.items() if not (value.is_integer and value > 0)}
        if size.is_Symbol or POISON_SIZE in size.free_symbols or size.free_symbols & reported:
            return  # a named size is held to these rules where it is declared
        value = expand_sizes(size, self.sizes).xreplace({size_symbol(name): v for name, v in values.items()})
        if not value.is_number:
            return
        if value.is_integer and 0 < value <= LIMITS.max_size:
            return
        why = (
            f"is over the limit of {LIMITS.max_size:,}"
            if value.is_integer and value > 0
            else "is not a whole positive number"
        )
        number = number_text(value)
        shown = number if number.startswith(str(size)) else f"{size} = {number}"
        self.error(f"axis {axis.leg} of {d.name} has size {shown}, which {why}", axis.size.span)

    def _check_stored_size(self, d: syn.Declaration, axes: tuple[Axis, ...]) -> None:
        """A parameter is built once, at sizes known before any input: an axis over a run-time
        size (N) has no size then. A table over positions is declared over a maximum length and
        read at the run-time length with a slice (`P[n: N, f]`)."""
        if d.kind != "param":
            return
        free = self.runtime_sizes
        runtime = [
            (axis, syntax, sorted(str(s) for s in expand_sizes(axis.size, self.sizes).free_symbols & free))
            for axis, syntax in zip(axes, d.axes, strict=True)
        ]
        runtime = [(axis, syntax, used[0]) for axis, syntax, used in runtime if used]
        if not runtime:
            return
        names = iter(n for n in "ijkluvw" if n not in self.legs and n not in {a.leg for a in axes})
        declared, used = [], []
        for axis in axes:
            over = next((size for a, _, size in runtime if a is axis), None)
            if over is None:
                declared.append(f"{axis.leg}: {axis.size}")
                used.append(axis.leg)
            else:
                declared.append(f"{next(names, axis.leg + '0')}: L")
                used.append(f"{axis.leg}: {axis.size}")
        axis, _, size = runtime[0]
        self.error(
            f"param {d.name} has axis {axis.leg} over the run-time size {size}, "
            "which is not known when parameters are built",
            *(syntax.span for _, syntax, _ in runtime),
            hint=f"declare it over a maximum length with legs of its own, e.g. size L = 1024 and "
            f"param {d.name}[{', '.join(declared)}], then read its first entries where it is used: "
            f"{d.name}[{', '.join(used)}]",
        )

    def _check_axis_names(self, d: syn.Declaration) -> None:
        seen: dict[str, syn.Axis] = {}
        for axis in d.axes:
            if axis.leg in seen:
                self.error(f"leg '{axis.leg}' names two axes of {d.name}", axis.span, seen[axis.leg].span)
            seen[axis.leg] = axis

    def _initializer(self, d: syn.Declaration, axes: tuple[Axis, ...]) -> Init | None:
        allowed = INITIALIZERS.get(d.kind, ())
        if d.init is None:
            if d.kind == "const":
                self.error(f"constant {d.name} needs a value", d.span, hint=f"write '= ...', {one_of(allowed)}")
            return Init("normal", (("mode", "train"),)) if d.kind == "random" else None
        if not allowed:
            self.error(f"{d.kind} {d.name} takes no initializer", d.init.span, hint="inputs are given at run time")
            return None
        name, args, keywords, span = call_parts(d.init)
        if name is None:
            self.error(f"expected an initializer for {d.kind} {d.name}", d.init.span, hint=one_of(allowed))
            return None
        if name not in allowed:
            self.error(
                f"unknown initializer '{name}' for {d.kind} {d.name}",
                span,
                hint=join_hint(did_you_mean(name, allowed), one_of(allowed)),
            )
            return None
        return self._init_params(d, axes, name, args, keywords, span)

    def _init_params(self, d, axes, name, args, keywords, span) -> Init:
        if d.kind == "random":
            return self._random_mode(d, args, keywords, span)
        if name == "values":
            return self._literal_values(d, axes, args, keywords, span)
        known = INIT_PARAMS[name]
        params: list[tuple[str, sympy.Expr | str]] = []
        if len(args) > len(known):
            self.error(
                f"{name} takes {len(known)} argument(s), got {len(args)}",
                span,
                hint=f"arguments: {', '.join(known) or 'none'}",
            )
        for key, value in zip(known, args, strict=False):
            params.append((key, self.scalar_of(value)))
        for kw in keywords:
            if kw.name not in known:
                self.error(
                    f"unknown argument '{kw.name}' of {name}",
                    kw.span,
                    hint=join_hint(did_you_mean(kw.name, known), f"arguments: {', '.join(known) or 'none'}"),
                )
                continue
            params.append((kw.name, self.scalar_of(kw.value)))
        if name == "identity":
            sizes = {expand_sizes(a.size, self.sizes) for a in axes}
            if len(axes) < 2 or len(sizes) > 1:
                self.error(
                    f"identity needs two or more axes of one size; {d.name} has "
                    + (", ".join(str(a.size) for a in axes) or "none"),
                    span,
                )
        if name == "uniform" and {k for k, _ in params} != {"low", "high"}:
            self.error("uniform needs low and high", span, hint="uniform(low = -0.1, high = 0.1)")
        if name == "fill" and "value" not in {k for k, _ in params}:
            self.error("fill needs a value", span, hint="fill(0.1) or fill(value = 0.1)")
        return Init(name, tuple(params), span)

    def _literal_values(self, d, axes, args, keywords, span) -> Init:
        """`values(0, -1, 1, 0)`: the entries written out, row-major over the declared axes (RoPE's
        2×2 rotation generator); their count must be the number of entries."""
        for kw in keywords:
            self.error("values takes numbers only, no keyword arguments", kw.span, hint="e.g. values(0, -1, 1, 0)")
        entries = tuple(self.scalar_of(a) for a in args)
        known = size_values(self.sizes)
        subs = {self.sizes[k].symbol: v for k, v in known.items()}
        count = expand_sizes(sympy.Mul(*(a.size for a in axes)), self.sizes).xreplace(subs)
        shape = ", ".join(f"{a.leg}: {a.size}" for a in axes)
        if not count.is_Integer:
            self.error(
                f"values needs every axis of {d.name} to have a size known before any input ({d.name}[{shape}])",
                span,
                hint="give literal entries only to a small fixed table",
            )
        elif len(entries) != int(count):
            self.error(
                f"values gives {len(entries)} number(s) but {d.name}[{shape}] has {int(count)} entries",
                span,
                hint="write one number per entry, row-major (the last axis varies fastest)",
            )
        elif any(POISON_SIZE in v.free_symbols for v in entries):
            pass
        elif any(v.free_symbols - {s.symbol for s in self.sizes.values()} for v in entries):
            self.error("values takes numbers and sizes", span)
        return Init("values", (), span, entries)

    def _random_mode(self, d, args, keywords, span) -> Init:
        mode = "train"
        for kw in keywords:
            if kw.name != "mode":
                self.error(f"unknown argument '{kw.name}' of normal noise", kw.span, hint="arguments: mode")
                continue
            value = kw.value.name if isinstance(kw.value, syn.Name) else None
            if value not in RANDOM_MODES:
                found = f" '{value}'" if value else ""
                self.error(
                    f"unknown noise mode{found}",
                    kw.value.span,
                    hint=join_hint(did_you_mean(value or "", RANDOM_MODES), one_of(RANDOM_MODES)),
                )
            else:
                mode = value
        if args:
            self.error(
                "random nodes are standard normal; scale them in a statement",
                args[0].span,
                hint="e.g. noise[m n s] = sigma[m] eps[m n s]",
            )
        return Init("normal", (("mode", mode),), span)
