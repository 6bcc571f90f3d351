"""A pure Itanium C++ ABI demangler, enough for CUDA kernel names.

ptxas reports kernels by mangled name (``_Z5saxpyifPKfPf``); the index knows
them by source name. :func:`demangle` recovers the qualified name with template
arguments (``ns::kernel<float>``), the base name (``kernel``) and the parameter
types. It follows the grammar in the Itanium C++ ABI, section 5.1 "External
Names" (https://itanium-cxx-abi.github.io/cxx-abi/abi.html#mangling), covering
nested names, templates and template parameters, substitutions, CV and pointer
types, arrays, function types, literals and the common builtin types. Anything
outside that subset gives None, never a wrong name. ``extern "C"`` kernels are
not mangled and come back unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

_BUILTINS = {
    "v": "void", "w": "wchar_t", "b": "bool", "c": "char", "a": "signed char", "h": "unsigned char",
    "s": "short", "t": "unsigned short", "i": "int", "j": "unsigned int", "l": "long", "m": "unsigned long",
    "x": "long long", "y": "unsigned long long", "n": "__int128", "o": "unsigned __int128", "f": "float",
    "d": "double", "e": "long double", "g": "__float128", "z": "...",
}
_D_BUILTINS = {
    "d": "decimal64", "e": "decimal128", "f": "decimal32", "h": "half", "i": "char32_t", "s": "char16_t",
    "u": "char8_t", "a": "auto", "c": "decltype(auto)", "n": "decltype(nullptr)",
}
_STD_SUBS = {
    "t": "std", "a": "std::allocator", "b": "std::basic_string", "s": "std::string",
    "i": "std::istream", "o": "std::ostream", "d": "std::iostream",
}
_OPERATORS = {
    "nw": "new", "na": "new[]", "dl": "delete", "da": "delete[]", "ps": "+", "ng": "-", "ad": "&", "de": "*",
    "co": "~", "pl": "+", "mi": "-", "ml": "*", "dv": "/", "rm": "%", "an": "&", "or": "|", "eo": "^",
    "aS": "=", "pL": "+=", "mI": "-=", "mL": "*=", "dV": "/=", "rM": "%=", "aN": "&=", "oR": "|=", "eO": "^=",
    "ls": "<<", "rs": ">>", "lS": "<<=", "rS": ">>=", "eq": "==", "ne": "!=", "lt": "<", "gt": ">", "le": "<=",
    "ge": ">=", "ss": "<=>", "nt": "!", "aa": "&&", "oo": "||", "pp": "++", "mm": "--", "cm": ",", "pm": "->*",
    "pt": "->", "cl": "()", "ix": "[]", "qu": "?",
}


@dataclass(frozen=True)
class Demangled:
    qualified_name: str
    """``ns::kernel<float>``."""
    base_name: str
    """``kernel``: the last name component without template arguments."""
    scope: tuple[str, ...]
    """Enclosing namespaces/classes, outermost first (``("ns",)``)."""
    template_args: tuple[str, ...]
    parameters: tuple[str, ...]
    """Parameter types (``("float*", "int")``); empty for ``f(void)``."""

    @property
    def signature(self) -> str:
        return f"{self.qualified_name}({', '.join(self.parameters)})"


class _Fail(Exception):
    pass


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.subs: list[str] = []
        self.template_args: list[str] = []

    # -- cursor ---------------------------------------------------------
    def peek(self, n: int = 1) -> str:
        return self.s[self.i : self.i + n]

    def eat(self, token: str) -> bool:
        if self.s.startswith(token, self.i):
            self.i += len(token)
            return True
        return False

    def need(self, token: str) -> None:
        if not self.eat(token):
            raise _Fail(f"expected {token!r} at {self.i}")

    def number(self) -> int:
        negative = self.eat("n")
        start = self.i
        while self.i < len(self.s) and self.s[self.i].isdigit():
            self.i += 1
        if start == self.i:
            raise _Fail("number")
        value = int(self.s[start : self.i])
        return -value if negative else value

    def seq_id(self, terminator: str = "_") -> int:
        """Base-36 index used by substitutions and template parameters: ``_`` -> 0, ``0_`` -> 1."""
        if self.eat(terminator):
            return 0
        start = self.i
        while self.i < len(self.s) and (self.s[self.i].isdigit() or self.s[self.i].isupper()):
            self.i += 1
        if start == self.i:
            raise _Fail("seq-id")
        value = int(self.s[start : self.i], 36)
        self.need(terminator)
        return value + 1

    # -- names ----------------------------------------------------------
    def encoding(self) -> Demangled:
        scope, base, targs, is_template = self.name()
        params: list[str] = []
        if self.i < len(self.s) and self.peek() not in ("E", "."):
            if is_template and not base.startswith("~") and base not in scope[-1:]:
                self.type()  # the return type, encoded for function templates only
            while self.i < len(self.s) and self.peek() not in ("E", "."):
                params.append(self.type())
        if params == ["void"]:
            params = []
        qualified = "::".join((*scope, base + (f"<{', '.join(targs)}>" if targs else "")))
        return Demangled(qualified, base, tuple(scope), tuple(targs), tuple(params))

    def name(self) -> tuple[list[str], str, list[str], bool]:
        """(scope, base name, template args of the base, whether the base is a template)."""
        if self.eat("N"):
            return self.nested_name()
        if self.peek(2) == "St":
            self.i += 2
            base = self.unqualified_name()
            scope = ["std"]
        elif self.peek() == "S":
            sub = self.substitution()
            if self.peek() != "I":
                raise _Fail("substitution name without template args")
            scope, base = _split(sub)
        elif self.eat("Z"):
            return self.local_name()
        else:
            scope, base = [], self.unqualified_name()
        if self.peek() == "I":
            self.subs.append("::".join((*scope, base)))
            targs = self.template_args_list()
            self.template_args = targs
            return scope, base, targs, True
        return scope, base, [], False

    def local_name(self) -> tuple[list[str], str, list[str], bool]:
        outer = self.encoding()
        self.need("E")
        if self.eat("s"):
            return [outer.qualified_name], "string literal", [], False
        scope, base, targs, is_template = self.name()
        if self.eat("_"):
            self.number()
        return [outer.qualified_name, *scope], base, targs, is_template

    def nested_name(self) -> tuple[list[str], str, list[str], bool]:
        while self.peek() in ("r", "V", "K"):
            self.i += 1
        if self.peek() in ("R", "O"):
            self.i += 1
        parts: list[str] = []
        last_targs: list[str] = []
        is_template = False
        while not self.eat("E"):
            if self.i >= len(self.s):
                raise _Fail("unterminated nested name")
            c = self.peek()
            if c == "I":
                if not parts:
                    raise _Fail("template args without a name")
                last_targs = self.template_args_list()
                self.template_args = last_targs
                parts[-1] = f"{parts[-1]}<{', '.join(last_targs)}>"
                is_template = True
                self.subs.append("::".join(parts))
                continue
            if c == "S" and self.peek(2) != "St":
                parts = _split_all(self.substitution())
            elif c == "S":
                self.i += 2
                parts.append("std")
                parts.append(self.unqualified_name())
                self.subs.append("::".join(parts))
            elif c == "T":
                parts = [self.template_param()]
                self.subs.append("::".join(parts))
            elif c == "C" or (c == "D" and self.peek(2)[1:2] in ("0", "1", "2", "4", "5")):
                self.i += 2
                if c == "C" and self.peek().isdigit():
                    self.i += 1
                owner = _strip_targs(parts[-1]) if parts else ""
                parts.append(owner if c == "C" else "~" + owner)
                self.subs.append("::".join(parts))
            else:
                parts.append(self.unqualified_name())
                self.subs.append("::".join(parts))
            if self.peek() != "I":
                last_targs, is_template = [], False
        if not parts:
            raise _Fail("empty nested name")
        if self.subs and self.subs[-1] == "::".join(parts):
            # The complete nested name is not itself a substitution candidate.
            self.subs.pop()
        base = _strip_targs(parts[-1])
        return [_p for _p in parts[:-1]], base, last_targs, is_template

    def unqualified_name(self) -> str:
        c = self.peek()
        if c.isdigit():
            return self.source_name()
        if self.eat("Ut"):
            n = self.seq_id() if self.peek() != "_" else (self.eat("_") and 0)
            return f"{{unnamed type#{n + 1}}}"
        if self.eat("Ul"):
            while not self.eat("E"):
                self.type()
            n = self.seq_id() if self.peek() != "_" else (self.eat("_") and 0)
            return f"{{lambda#{n + 1}}}"
        if c == "L":  # internal linkage marker before a source name
            self.i += 1
            return self.source_name()
        if self.eat("cv"):
            return "operator " + self.type()
        if self.eat("li"):
            return 'operator"" ' + self.source_name()
        op = _OPERATORS.get(self.peek(2))
        if op is not None:
            self.i += 2
            return "operator" + op
        if c == "B":
            self.i += 1
            self.source_name()
            return self.unqualified_name()
        raise _Fail(f"unqualified name at {self.i}")

    def source_name(self) -> str:
        length = self.number()
        if length <= 0 or self.i + length > len(self.s):
            raise _Fail("source name length")
        name = self.s[self.i : self.i + length]
        self.i += length
        if name.startswith("_GLOBAL__N"):
            return "(anonymous namespace)"
        while self.peek() == "B":  # ABI tags: [abi:cxx11]
            self.i += 1
            self.source_name()
        return name

    def substitution(self) -> str:
        self.need("S")
        std = _STD_SUBS.get(self.peek())
        if std is not None and not self.peek().isdigit() and not self.peek().isupper():
            self.i += 1
            return std
        index = self.seq_id()
        if index >= len(self.subs):
            raise _Fail("substitution out of range")
        return self.subs[index]

    def template_param(self) -> str:
        self.need("T")
        index = self.seq_id()
        if index >= len(self.template_args):
            raise _Fail("template parameter out of range")
        return self.template_args[index]

    def template_args_list(self) -> list[str]:
        self.need("I")
        args = []
        while not self.eat("E"):
            if self.i >= len(self.s):
                raise _Fail("unterminated template args")
            args.append(self.template_arg())
        return args

    def template_arg(self) -> str:
        if self.peek() == "L":
            return self.literal()
        if self.eat("X"):
            # The usual cases: a template parameter or a literal used as a value (Tag<N>).
            if self.peek() in ("T", "L"):
                saved = self.i
                try:
                    value = self.template_param() if self.peek() == "T" else self.literal()
                    if self.eat("E"):
                        return value
                except _Fail:
                    pass
                self.i = saved
            depth, start = 1, self.i
            while depth and self.i < len(self.s):
                depth += {"X": 0, "E": -1}.get(self.s[self.i], 0)
                self.i += 1
            return self.s[start : self.i - 1]
        if self.eat("J"):
            items = []
            while not self.eat("E"):
                items.append(self.template_arg())
            return ", ".join(items)
        return self.type()

    def literal(self) -> str:
        self.need("L")
        if self.eat("_Z"):
            value = self.encoding().qualified_name
            self.need("E")
            return value
        kind = self.type()
        start = self.i
        while self.i < len(self.s) and self.s[self.i] != "E":
            self.i += 1
        raw = self.s[start : self.i]
        self.need("E")
        value = "-" + raw[1:] if raw.startswith("n") else raw
        if kind == "bool":
            return "true" if value == "1" else "false"
        suffix = {"unsigned int": "u", "long": "l", "unsigned long": "ul", "long long": "ll", "unsigned long long": "ull"}
        return value + suffix.get(kind, "") if kind != "int" else value

    # -- types ----------------------------------------------------------
    def type(self) -> str:
        c = self.peek()
        if c in _BUILTINS:
            self.i += 1
            return _BUILTINS[c]
        if c == "u":
            self.i += 1
            return self.source_name()
        if c in ("r", "V", "K"):
            quals = []
            while self.peek() in ("r", "V", "K"):
                quals.append({"r": "__restrict__", "V": "volatile", "K": "const"}[self.peek()])
                self.i += 1
            inner = self.type()
            result = _qualify(inner, quals)
            self.subs.append(result)
            return result
        if c in ("P", "R", "O"):
            self.i += 1
            inner = self.type()
            result = _pointer(inner, {"P": "*", "R": "&", "O": "&&"}[c])
            self.subs.append(result)
            return result
        if c == "A":
            self.i += 1
            size = str(self.number()) if self.peek().isdigit() else ""
            self.need("_")
            result = f"{self.type()}[{size}]"
            self.subs.append(result)
            return result
        if c == "F":
            self.i += 1
            self.eat("Y")
            ret = self.type()
            args = []
            while not self.eat("E"):
                if self.peek() in ("R", "O") and self.peek(2)[1:] == "E":
                    self.i += 1
                    continue
                args.append(self.type())
            result = f"{ret} ({', '.join(a for a in args if a != 'void')})"
            self.subs.append(result)
            return result
        if c == "T":
            result = self.template_param()
            self.subs.append(result)
            if self.peek() == "I":
                result += f"<{', '.join(self.template_args_list())}>"
                self.subs.append(result)
            return result
        if c == "D":
            code = self.peek(2)[1:]
            if code in _D_BUILTINS:
                self.i += 2
                return _D_BUILTINS[code]
            if self.eat("DF"):
                bits = self.number()
                self.eat("_")
                return f"_Float{bits}"
            if self.eat("Dp"):
                return self.type() + "..."
            if self.eat("Dv"):
                size = self.number()
                self.need("_")
                result = f"{self.type()} __attribute__((vector_size({size})))"
                self.subs.append(result)
                return result
            raise _Fail(f"type D{code}")
        if c == "S":
            if self.peek(2) == "St":
                self.i += 2
                result = "std::" + self.unqualified_name()
                self.subs.append(result)
            else:
                result = self.substitution()
            if self.peek() == "I":
                result += f"<{', '.join(self.template_args_list())}>"
                self.subs.append(result)
            return result
        if c == "N" or c.isdigit() or c == "Z":
            saved = self.template_args
            scope, base, targs, _is_template = self.name()
            self.template_args = saved
            result = "::".join((*scope, base + (f"<{', '.join(targs)}>" if targs else "")))
            self.subs.append(result)
            return result
        raise _Fail(f"type at {self.i}")


def _split(name: str) -> tuple[list[str], str]:
    parts = _split_all(name)
    return parts[:-1], parts[-1]


def _split_all(name: str) -> list[str]:
    """Split ``a::b<c::d>::e`` on top-level ``::`` only."""
    parts, depth, start = [], 0, 0
    i = 0
    while i < len(name):
        ch = name[i]
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == ":" and depth == 0 and name.startswith("::", i):
            parts.append(name[start:i])
            start = i + 2
            i += 1
        i += 1
    parts.append(name[start:])
    return parts


def _strip_targs(name: str) -> str:
    cut = name.find("<")
    return name if cut <= 0 or name.startswith("operator") else name[:cut]


def _qualify(inner: str, quals: list[str]) -> str:
    # Qualifiers bind to the pointer when the inner type is a pointer: "float* const".
    if inner.endswith(("*", "&")):
        return f"{inner} {' '.join(reversed(quals))}"
    return f"{' '.join(reversed(quals))} {inner}"


def _pointer(inner: str, mark: str) -> str:
    if inner.endswith("]") and "[" in inner:  # array type -> pointer to array
        element, extent = inner.split("[", 1)
        return f"{element} ({mark})[{extent}"
    if inner.endswith(")") and " (" in inner:  # function type -> function pointer
        ret, args = inner.split(" (", 1)
        return f"{ret} ({mark})({args}"
    return inner + mark


def demangle(mangled: str) -> Demangled | None:
    """Demangle an Itanium C++ name; an unmangled name (``extern "C"``) is returned as itself.

    ``_Z5saxpyifPKfPf`` -> qualified ``saxpy``, parameters ``(int, float, const float*, float*)``;
    ``_Z6kernelIfEvPT_i`` -> ``kernel<float>``, base ``kernel``. None when the name
    is mangled but uses a construct this demangler does not know.
    """
    name = mangled.strip()
    if not name.startswith("_Z"):
        if name and (name[0].isalpha() or name[0] == "_") and all(ch.isalnum() or ch == "_" for ch in name):
            return Demangled(name, name, (), (), ())
        return None
    # Clone suffixes (".constprop.0") are not part of the name.
    core = name[2:].split(".", 1)[0]
    parser = _Parser(core)
    try:
        result = parser.encoding()
    except (_Fail, IndexError, ValueError, RecursionError):
        return None
    if parser.i != len(core):
        return None
    return result


def base_name(mangled: str) -> str:
    """The source-level base name (``saxpy``), or the input itself when it cannot be demangled."""
    result = demangle(mangled)
    return result.base_name if result is not None else mangled
