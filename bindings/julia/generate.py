#!/usr/bin/env python3
"""Generates the Julia low-level declarations of co2.h (CO2.jl/src/generated.jl) with libclang.

Everything comes from the C parser, not from text patterns: typedefs, struct layouts (field
types, and every size and offset clang computed, which CO2.jl's tests compare with Julia's own
layout), enum constants, function signatures, and the values of the header's macros, which are
evaluated by clang in a probe translation unit (scalar macros by type and value, the *_INIT
initializer macros field by field).

    /usr/bin/python3 bindings/julia/generate.py           rewrite generated.jl
    /usr/bin/python3 bindings/julia/generate.py --check   fail (exit 1, with a diff) if the
                                                          committed file is stale; exit 77
                                                          (skip) without python3-clang
Needs Debian's python3-clang and libclang (apt-get install python3-clang libclang-dev).
"""
import ctypes
import difflib
import os
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
INCLUDE = os.path.join(ROOT, "capi", "include")
HEADER = os.path.join(INCLUDE, "co2", "co2.h")
OUTPUT = os.path.join(ROOT, "bindings", "julia", "CO2.jl", "src", "generated.jl")

try:
    import clang.cindex as ci
except ImportError:
    if "--check" in sys.argv:
        print("python3-clang not installed: skipping", file=sys.stderr)
        sys.exit(77)
    raise

CLANG_ARGS = ["-x", "c", "-std=c99", "-I" + INCLUDE]

# C builtin types (canonical kinds) and the standard typedefs the header uses, in Julia.
BUILTIN = {
    ci.TypeKind.VOID: "Cvoid",
    ci.TypeKind.CHAR_S: "Cchar",
    ci.TypeKind.SCHAR: "Cchar",
    ci.TypeKind.UCHAR: "Cuchar",
    ci.TypeKind.SHORT: "Cshort",
    ci.TypeKind.USHORT: "Cushort",
    ci.TypeKind.INT: "Cint",
    ci.TypeKind.UINT: "Cuint",
    ci.TypeKind.LONG: "Clong",
    ci.TypeKind.ULONG: "Culong",
    ci.TypeKind.LONGLONG: "Clonglong",
    ci.TypeKind.ULONGLONG: "Culonglong",
    ci.TypeKind.FLOAT: "Cfloat",
    ci.TypeKind.DOUBLE: "Cdouble",
}
STANDARD_TYPEDEFS = {
    "int8_t": "Int8", "uint8_t": "UInt8", "int16_t": "Int16", "uint16_t": "UInt16",
    "int32_t": "Int32", "uint32_t": "UInt32", "int64_t": "Int64", "uint64_t": "UInt64",
    "size_t": "Csize_t", "ptrdiff_t": "Cptrdiff_t",
}


class Generator:
    def __init__(self):
        self.index = ci.Index.create()
        tu = self.index.parse(HEADER, args=CLANG_ARGS,
                              options=ci.TranslationUnit.PARSE_DETAILED_PROCESSING_RECORD)
        self.fail_on_diagnostics(tu)
        self.tu = tu
        self.public_typedefs = set()   # co2_* typedef names, declared in the header
        self.struct_typedefs = {}      # struct declaration cursor hash -> typedef name
        self.handle_structs = set()    # opaque struct names (co2_comm, ...)
        self.lines = []

    @staticmethod
    def fail_on_diagnostics(tu):
        bad = [d for d in tu.diagnostics if d.severity >= ci.Diagnostic.Warning]
        if bad:
            for d in bad:
                print(f"{d.location.file}:{d.location.line}: {d.spelling}", file=sys.stderr)
            sys.exit("error: clang reported problems in the header")

    def in_header(self, cursor):
        return cursor.location.file is not None and os.path.samefile(cursor.location.file.name, HEADER)

    # ---------------------------------------------------------------------------- types ----
    def julia_type(self, t):
        """The Julia spelling of C type `t` in a declaration."""
        if t.kind == ci.TypeKind.ELABORATED:
            t = t.get_named_type()
        if t.kind == ci.TypeKind.TYPEDEF:
            name = t.get_declaration().spelling
            if name in STANDARD_TYPEDEFS:
                return STANDARD_TYPEDEFS[name]
            if name in self.public_typedefs:
                return name
            return self.julia_type(t.get_canonical())
        if t.kind == ci.TypeKind.POINTER:
            pointee = t.get_pointee()
            if pointee.kind == ci.TypeKind.FUNCTIONPROTO:
                return "Ptr{Cvoid}"
            return "Ptr{" + self.julia_type(pointee) + "}"
        if t.kind == ci.TypeKind.RECORD:
            decl = t.get_declaration()
            return self.struct_typedefs.get(decl.hash, decl.spelling)
        if t.kind == ci.TypeKind.CONSTANTARRAY:
            return "NTuple{%d, %s}" % (t.get_array_size(), self.julia_type(t.get_array_element_type()))
        canonical = t.get_canonical()
        if canonical.kind in BUILTIN:
            return BUILTIN[canonical.kind]
        raise SystemExit(f"error: no Julia type for C type {t.spelling!r} ({t.kind})")

    # ------------------------------------------------------------------------- macros ----
    def evaluate_macros(self, scalars, initializers):
        """Values of object-like macros, evaluated by clang: scalar macros by their own type,
        initializer macros (CO2_X_INIT) as an initializer of co2_x_t.
        Returns {name: ("scalar", type, value) | ("struct", type, [(kind, value)...])}."""
        probe = ['#include "co2/co2.h"']
        for name in scalars:
            probe.append(f"static const __typeof__({name}) co2_probe_{name} = {name};")
        for name in initializers:
            typedef = name[:-len("_INIT")].lower() + "_t"
            if typedef not in self.public_typedefs:
                raise SystemExit(f"error: initializer macro {name} has no struct {typedef}")
            probe.append(f"static const {typedef} co2_probe_{name} = {name};")
        src = "\n".join(probe) + "\n"
        tu = self.index.parse("co2_probe.c", args=CLANG_ARGS + ["-std=gnu99"],
                              unsaved_files=[("co2_probe.c", src)])
        self.fail_on_diagnostics(tu)
        lib = ci.conf.lib
        lib.clang_Cursor_Evaluate.argtypes = [ci.Cursor]
        lib.clang_Cursor_Evaluate.restype = ctypes.c_void_p
        lib.clang_EvalResult_getKind.argtypes = [ctypes.c_void_p]
        lib.clang_EvalResult_getKind.restype = ctypes.c_int
        lib.clang_EvalResult_isUnsignedInt.argtypes = [ctypes.c_void_p]
        lib.clang_EvalResult_isUnsignedInt.restype = ctypes.c_uint
        lib.clang_EvalResult_getAsUnsigned.argtypes = [ctypes.c_void_p]
        lib.clang_EvalResult_getAsUnsigned.restype = ctypes.c_ulonglong
        lib.clang_EvalResult_getAsLongLong.argtypes = [ctypes.c_void_p]
        lib.clang_EvalResult_getAsLongLong.restype = ctypes.c_longlong
        lib.clang_EvalResult_getAsDouble.argtypes = [ctypes.c_void_p]
        lib.clang_EvalResult_getAsDouble.restype = ctypes.c_double
        lib.clang_EvalResult_dispose.argtypes = [ctypes.c_void_p]

        def evaluate(cursor):
            result = lib.clang_Cursor_Evaluate(cursor)
            if not result:
                return None
            try:
                kind = lib.clang_EvalResult_getKind(result)
                if kind == 1:  # CXEval_Int
                    if lib.clang_EvalResult_isUnsignedInt(result):
                        return lib.clang_EvalResult_getAsUnsigned(result)
                    return lib.clang_EvalResult_getAsLongLong(result)
                if kind == 2:  # CXEval_Float
                    return lib.clang_EvalResult_getAsDouble(result)
                return None
            finally:
                lib.clang_EvalResult_dispose(result)

        values = {}
        for cursor in tu.cursor.get_children():
            if cursor.kind != ci.CursorKind.VAR_DECL or not cursor.spelling.startswith("co2_probe_"):
                continue
            name = cursor.spelling[len("co2_probe_"):]
            init = [c for c in cursor.get_children() if c.kind != ci.CursorKind.TYPE_REF]
            if not init:
                raise SystemExit(f"error: macro {name} has no initializer in the probe")
            expr = init[-1]
            while expr.kind == ci.CursorKind.UNEXPOSED_EXPR and len(list(expr.get_children())) == 1 \
                    and expr.type.get_canonical().kind == ci.TypeKind.RECORD:
                expr = next(expr.get_children())
            if expr.kind == ci.CursorKind.INIT_LIST_EXPR:
                fields = []
                for element in expr.get_children():
                    tokens = [t.spelling for t in element.get_tokens()]
                    if "sizeof" in tokens:
                        fields.append(("sizeof", None))
                    elif element.type.get_canonical().kind == ci.TypeKind.POINTER or tokens == ["NULL"]:
                        fields.append(("null", None))
                    else:
                        value = evaluate(element)
                        if value is None:
                            raise SystemExit(f"error: clang cannot evaluate a field of {name}")
                        fields.append(("value", value))
                values[name] = ("struct", cursor.type, fields)
            else:
                value = evaluate(cursor)
                if value is None:
                    raise SystemExit(f"error: clang cannot evaluate macro {name}")
                values[name] = ("scalar", cursor.type, value)
        return values

    def pointer_size(self):
        for c in self.tu.cursor.get_children():
            if c.kind == ci.CursorKind.TYPEDEF_DECL and c.spelling == "co2_comm_t":
                return c.underlying_typedef_type.get_size()
        raise SystemExit("error: co2_comm_t not found")

    @staticmethod
    def julia_literal(jtype, value):
        if isinstance(value, float):
            return f"{jtype}({value!r})"
        return f"{jtype}({value})"

    # ----------------------------------------------------------------------- generate ----
    def generate(self):
        top = [c for c in self.tu.cursor.get_children() if self.in_header(c)]
        for c in top:
            if c.kind == ci.CursorKind.TYPEDEF_DECL and c.spelling.startswith("co2_"):
                self.public_typedefs.add(c.spelling)
                underlying = c.underlying_typedef_type
                if underlying.kind == ci.TypeKind.ELABORATED:
                    underlying = underlying.get_named_type()
                if underlying.kind == ci.TypeKind.RECORD:
                    self.struct_typedefs[underlying.get_declaration().hash] = c.spelling

        out = self.lines
        out += [
            "# Generated from capi/include/co2/co2.h by bindings/julia/generate.py (libclang); do not edit.",
            "# Regenerate: /usr/bin/python3 bindings/julia/generate.py   (CI checks it is current)",
            "",
        ]
        macros = [c for c in self.tu.cursor.get_children()
                  if c.kind == ci.CursorKind.MACRO_DEFINITION and self.in_header(c)
                  and c.spelling.startswith("CO2_")]
        scalar_macros, init_macros = [], []
        for m in macros:
            tokens = [t.spelling for t in m.get_tokens()][1:]
            if not tokens:
                continue  # include guard
            (init_macros if tokens[0] == "{" else scalar_macros).append(m.spelling)
        values = self.evaluate_macros(scalar_macros, init_macros)

        out += ["# ---- macros (values evaluated by clang) ----"]
        for name in scalar_macros:
            _, ctype, value = values[name]
            out.append(f"const {name} = {self.julia_literal(self.julia_type(ctype), value)}")
        out.append("")

        function_names = []
        structs_layout = []
        for c in top:
            if c.kind == ci.CursorKind.TYPEDEF_DECL and c.spelling.startswith("co2_"):
                underlying = c.underlying_typedef_type
                if underlying.kind == ci.TypeKind.ELABORATED:
                    underlying = underlying.get_named_type()
                if underlying.kind == ci.TypeKind.RECORD:
                    decl = underlying.get_declaration()
                    fields = list(underlying.get_fields())
                    mutable = bool(fields) and fields[0].spelling == "size"
                    keyword = "mutable struct" if mutable else "struct"
                    out.append(f"{keyword} {c.spelling}")
                    for f in fields:
                        out.append(f"    {f.spelling}::{self.julia_type(f.type)}")
                    out.append("end")
                    structs_layout.append((c.spelling, underlying, fields))
                elif underlying.kind == ci.TypeKind.POINTER and \
                        underlying.get_pointee().get_canonical().kind == ci.TypeKind.RECORD and \
                        not list(underlying.get_pointee().get_canonical().get_declaration().get_children()):
                    opaque = underlying.get_pointee().get_canonical().get_declaration().spelling
                    if opaque not in self.handle_structs:
                        self.handle_structs.add(opaque)
                        out.append(f"mutable struct {opaque} end  # opaque handle target")
                    out.append(f"const {c.spelling} = Ptr{{{opaque}}}")
                elif underlying.kind == ci.TypeKind.POINTER and \
                        underlying.get_pointee().kind == ci.TypeKind.FUNCTIONPROTO:
                    proto = underlying.get_pointee()
                    sig = ", ".join(self.julia_type(a) for a in proto.argument_types())
                    out.append(f"const {c.spelling} = Ptr{{Cvoid}}  # {self.julia_type(proto.get_result())} (*)({sig})")
                else:
                    out.append(f"const {c.spelling} = {self.julia_type(underlying)}")
            elif c.kind == ci.CursorKind.ENUM_DECL:
                for e in c.get_children():
                    if e.kind == ci.CursorKind.ENUM_CONSTANT_DECL:
                        # C enumeration constants have type int.
                        out.append(f"const {e.spelling} = Cint({e.enum_value})")
            elif c.kind == ci.CursorKind.FUNCTION_DECL and c.spelling.startswith("co2_"):
                function_names.append(c.spelling)
                args = list(c.get_arguments())
                names = [a.spelling or f"arg{i}" for i, a in enumerate(args)]
                names = [n + "_" if n in ("function", "end", "begin", "type") else n for n in names]
                types = [self.julia_type(a.type) for a in args]
                result = self.julia_type(c.result_type)
                tuple_types = "(" + ", ".join(types) + ("," if len(types) == 1 else "") + ")"
                out.append(f"const _{c.spelling}_ptr = Ref{{Ptr{{Cvoid}}}}(C_NULL)")
                out.append(f"function {c.spelling}({', '.join(names)})")
                call_args = "".join(", " + n for n in names)
                out.append(f"    ccall(_{c.spelling}_ptr[], {result}, {tuple_types}{call_args})")
                out.append("end")
            else:
                continue
            out.append("")

        out += ["# ---- defaults of the *_INIT macros (evaluated by clang, field by field) ----"]
        for name in init_macros:
            _, ctype, fields = values[name]
            typedef = ctype.spelling.replace("const ", "")
            decl_fields = list(ctype.get_canonical().get_fields())
            parts = []
            for (kind, value), f in zip(fields, decl_fields):
                jt = self.julia_type(f.type)
                if kind == "sizeof":
                    parts.append(f"{jt}(sizeof({typedef}))")
                elif kind == "null":
                    parts.append(f"{jt}(C_NULL)")
                else:
                    parts.append(self.julia_literal(jt, value))
            if len(parts) != len(decl_fields):
                raise SystemExit(f"error: {name} initialises {len(parts)} of {len(decl_fields)} fields")
            out.append(f"{name}() = {typedef}(")
            out += [f"    {p}," for p in parts]
            out.append(")")
        out.append("")

        out += ["# ---- struct layouts as clang computed them for the generating target (bytes) ----",
                "const GENERATED_ON_WORD_SIZE = %d" % (8 * self.pointer_size()),
                "const LAYOUT = ("]
        for name, record, fields in structs_layout:
            offsets = ", ".join(f"{f.spelling} = {record.get_offset(f.spelling) // 8}" for f in fields)
            out.append(f"    {name} = (size = {record.get_size()}, align = {record.get_align()}, "
                       f"offsets = ({offsets},)),")
        out.append(")")
        out.append("")

        out += ["# ---- symbol binding: CO2.jl's __init__ calls this with the dlopen'ed libco2 ----",
                "const FUNCTION_NAMES = ("]
        out += [f"    :{n}," for n in function_names]
        out += [")", "", "function bind_symbols!(handle::Ptr{Cvoid})"]
        out += [f"    _{n}_ptr[] = Libdl.dlsym(handle, :{n})" for n in function_names]
        out += ["    return nothing", "end", ""]
        return "\n".join(out)


def main():
    text = Generator().generate()
    if "--check" in sys.argv:
        with open(OUTPUT) as f:
            committed = f.read()
        if committed != text:
            sys.stdout.writelines(difflib.unified_diff(committed.splitlines(True), text.splitlines(True),
                                                       "committed generated.jl", "from co2.h now"))
            print("error: bindings/julia/CO2.jl/src/generated.jl is stale: run "
                  "/usr/bin/python3 bindings/julia/generate.py and commit", file=sys.stderr)
            return 1
        print("CO2.jl declarations are current")
        return 0
    with open(OUTPUT, "w") as f:
        f.write(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
