"""Build the optional native rotary kernel (``posenc.encodings.rotary.kernels._rotary_native``).

Everything else about the package is in ``pyproject.toml``. The kernel is plain C against
Python's headers (no torch headers, about two seconds to build) in two files: the Python
interface and its bounds checks (``_rotary_native.c``) and the arithmetic (``_rotary_rows.c``),
compiled for the baseline instruction set with run-time dispatch to AVX2 and AVX-512 (see
``_rotary_rows.c``), and with OpenMP where the compiler has it: a large rotation is then shared
among the threads of the OpenMP runtime torch already runs (the loader gives the kernel the
``libgomp.so.1`` torch loaded), whose workers are waiting for work after torch's own
operators; where the compiler has no OpenMP the kernel is built without it and turns every
rotation on the calling thread. ``optional``: where no C compiler is found the install goes
on, and posenc uses its pure-torch path.
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

#: the rotation kernels' folder, where the C sources and the built module lie
KERNELS = "src/posenc/encodings/rotary/kernels"
#: what OpenMP adds to the compiler's and the linker's arguments
OPENMP = "-fopenmp"


class BuildWithOpenMP(build_ext):
    """``build_ext`` that builds each extension with :data:`OPENMP`, and again without it
    where the compiler or the linker refuses it."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception:  # (CompileError, LinkError, or the compiler's own)
            if OPENMP not in ext.extra_compile_args:
                raise
            ext.extra_compile_args = [a for a in ext.extra_compile_args if a != OPENMP]
            ext.extra_link_args = [a for a in ext.extra_link_args if a != OPENMP]
            super().build_extension(ext)


setup(
    cmdclass={"build_ext": BuildWithOpenMP},
    ext_modules=[
        Extension(
            "posenc.encodings.rotary.kernels._rotary_native",
            [f"{KERNELS}/_rotary_native.c", f"{KERNELS}/_rotary_rows.c"],
            depends=[f"{KERNELS}/rotary_rows.h"],
            # -ffp-contract=off: products rounded before the sum, as torch's operations do
            extra_compile_args=["-O3", "-ffp-contract=off", OPENMP],
            extra_link_args=[OPENMP],
            optional=True,
        )
    ],
)
