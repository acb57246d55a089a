"""Where a rotation runs: the formula and the public rotation functions (:mod:`.rotate`), the
one function that decides the path (:mod:`.select`), the kernels (:mod:`.native`, the C kernel
built from ``_rotary_native.c`` and ``_rotary_rows.c`` beside it; :mod:`.pytorch`, the pure-torch
path) and the custom operators that ``torch.compile`` sees (:mod:`.ops`). A new kernel goes
here."""
