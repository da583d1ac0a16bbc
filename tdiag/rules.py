"""Rule tables keyed on the expression kind (JAX's lowering rules, inductor's `register_lowering`):
each stage (build, check, print, render, evaluate, ...) keeps one `Rules` table in its own layer,
and each construct module under tdiag/constructs fills every table for its kind, or declares the
kind unsupported there with a reason. So a stage dispatches by one lookup, never by an isinstance
chain, and a table test finds a kind that lacks a rule."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

Rule = TypeVar("Rule", bound=Callable)


class MissingRuleError(LookupError):
    """A kind reached a stage that has no rule for it: a tdiag bug (a construct left a table out)."""


class UnsupportedError(NotImplementedError):
    """A kind reached a stage that declares it unsupported there; the message says why."""


class Rules(Generic[Rule]):
    """One stage's rules, keyed on the expression class: `@rules.register(Kind)` on a function
    adds one, `rules.unsupported(Kind, reason)` says the stage never takes the kind."""

    def __init__(self, stage: str):
        self.stage = stage
        self._rules: dict[type, Rule] = {}
        self._refusals: dict[type, str] = {}
        self._named: dict[str, Rule] = {}  # a stage dispatched by a word of the language (build)

    def register(self, kind: type, names: Iterable[str] = ()) -> Callable[[Rule], Rule]:
        """A decorator registering its function as the stage's rule for `kind` (once per kind),
        and for each of `names`, the words of the language that build it (`named`)."""

        def add(rule: Rule) -> Rule:
            self._claim(kind)
            self._rules[kind] = rule
            for name in names:
                if name in self._named:
                    raise ValueError(f"{self.stage} already has a rule for the word {name!r}")
                self._named[name] = rule
            return rule

        return add

    def unsupported(self, kind: type, reason: str) -> None:
        """Declare that this stage never takes `kind`, and why (the message `lookup` raises)."""
        self._claim(kind)
        self._refusals[kind] = reason

    def lookup(self, node: object) -> Rule:
        """The rule for `node`'s kind (its class, else the nearest base class with one)."""
        for kind in type(node).__mro__:
            if kind in self._rules:
                return self._rules[kind]
            if kind in self._refusals:
                raise UnsupportedError(f"{self.stage} does not take {kind.__name__}: {self._refusals[kind]}")
        raise MissingRuleError(f"no {self.stage} rule for {type(node).__name__} (register one in tdiag/constructs)")

    def named(self, name: str) -> Rule | None:
        """The rule registered for the word `name`, or None where no kind is built by it."""
        return self._named.get(name)

    def names(self) -> frozenset[str]:
        """Every word a rule is registered for."""
        return frozenset(self._named)

    def kinds(self) -> frozenset[type]:
        """Every kind this stage has a rule for or declares unsupported."""
        return frozenset((*self._rules, *self._refusals))

    def _claim(self, kind: type) -> None:
        if kind in self._rules or kind in self._refusals:
            raise ValueError(f"{self.stage} already has a rule for {kind.__name__}")

    def __repr__(self) -> str:
        return f"Rules({self.stage!r}, {len(self.kinds())} kinds)"
