"""Build the optional native rotary kernel (``posenc.encodings.rotary.kernels._rotary_native``).

Everything else about the package is in ``pyproject.toml``. The kernel is plain C against
Python's headers (no torch headers, about two seconds to build) in two files: the Python
interface and its bounds checks (``_rotary_native.c``) and the arithmetic (``_rotary_rows.c``),
compiled for the baseline instruction set with run-time dispatch to AVX2 and AVX-512 (see
``_rotary_rows.c``). ``optional``:
where no C compiler is found the install goes on, and posenc uses its pure-torch path.
"""

from setuptools import Extension, setup

#: the rotation kernels' folder, where the C sources and the built module lie
KERNELS = "src/posenc/encodings/rotary/kernels"

setup(
    ext_modules=[
        Extension(
            "posenc.encodings.rotary.kernels._rotary_native",
            [f"{KERNELS}/_rotary_native.c", f"{KERNELS}/_rotary_rows.c"],
            depends=[f"{KERNELS}/rotary_rows.h"],
            # -ffp-contract=off: products rounded before the sum, as torch's operations do
            extra_compile_args=["-O3", "-ffp-contract=off", "-pthread"],
            extra_link_args=["-pthread"],
            optional=True,
        )
    ]
)
