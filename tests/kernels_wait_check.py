#!/usr/bin/env python3
"""kernels_wait_check.py KERNELS_DIR - every kernel the op layer launches waits on its grid
dependency.

mg_op_launch_kernels (src/ops/op_builtin.c) launches every kernel of module "metrale" with
programmatic dependent launch, which is correct only if the kernel calls grid_dependency_wait()
(kernels/cuda/common/grid_dependency.cuh) before it touches memory earlier work writes. This
check reads each `extern "C" __global__` kernel under KERNELS_DIR (CUTLASS and FlashInfer
plugins, which launch their own kernels, and the module-test kernels excepted) and fails when
its body neither calls grid_dependency_wait() nor calls a function of the same file that does,
or when a `return` comes before that call. A textual check: it cannot see what a wait guards,
only that every kernel has one on every path that reaches memory."""
import pathlib
import re
import sys

EXCEPT_DIRS = {"cutlass"}
EXCEPT_FILES = {"test_kernels.cu", "vector_add.cu"}


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def body_at(text, start):
    """The text of the brace block opening at or after `start` (parameter list skipped)."""
    i = text.index("(", start)
    depth = 0
    while True:
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                break
        i += 1
    i = text.index("{", i)
    j, depth = i, 0
    while True:
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
        j += 1


def main(root):
    failures, kernels = [], 0
    for path in sorted(pathlib.Path(root).rglob("*.cu")):
        if path.name in EXCEPT_FILES or EXCEPT_DIRS & set(path.parts) or "flashinfer" in path.name:
            continue
        text = strip_comments(path.read_text())
        text = text.replace("\\\n", "\n")  # kernels defined by macros
        waiting = set()
        for m in re.finditer(r"\b(\w+)\s*(?:<[^;{}()]*>)?\s*\([^;{}]*\)\s*(?:const\s*)?\{", text):
            name = m.group(1)
            if name in ("if", "for", "while", "switch", "return"):
                continue
            try:
                if "grid_dependency_wait()" in body_at(text, m.start()):
                    waiting.add(name)
            except (ValueError, IndexError):
                pass
        for m in re.finditer(r'extern\s+"C"\s+__global__', text):
            kernels += 1
            header = text[m.end() : text.index("(", m.end())]
            name = header.split()[-1]
            body = body_at(text, m.end())
            calls = [c for c in waiting if re.search(r"\b%s\s*(<[^;]*>)?\s*\(" % re.escape(c), body)]
            at = body.find("grid_dependency_wait()")
            if at < 0 and calls:
                at = min(re.search(r"\b%s\s*(<[^;]*>)?\s*\(" % re.escape(c), body).start() for c in calls)
            if at < 0:
                failures.append(f"{path}: kernel {name} never calls grid_dependency_wait()")
            elif "return" in body[:at]:
                failures.append(f"{path}: kernel {name} may return before grid_dependency_wait()")
    for f in failures:
        print("FAIL", f)
    print(f"{kernels} kernels checked, {len(failures)} without a grid-dependency wait")
    return 1 if failures or kernels == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
