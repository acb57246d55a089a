"""Where a rotation runs: the formula and the public rotation functions (:mod:`.rotate`), the
one function that decides the mode and the kernel (:mod:`.select`), the interface every
kernel offers (:mod:`.kernel`) and the kernels behind it (:mod:`.native`, the C kernel built
from ``_rotary_native.c`` and ``_rotary_rows.c`` beside it; :mod:`.pytorch`, the pure-torch
path; :mod:`.triton_entry`, :mod:`.triton_kernel`, :mod:`.triton_launch` and
:mod:`.triton_op`, the Triton kernel for CUDA), and the custom operators that
``torch.compile`` sees (:mod:`.ops`). A new kernel goes here."""
