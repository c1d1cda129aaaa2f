"""torchvision 0.28.0 from PyPI is a CUDA build: beside the CPU torch its C operators do not
load, and its `_meta_registrations.py` registers fake kernels for `torchvision::nms` and
`torchvision::qnms` unconditionally, so `import torchvision` fails ("operator torchvision::nms
does not exist"). SGLang imports torchvision while loading its model configs. This guards those
two registrations as the file already guards the others (`torchvision.extension._has_ops()`).
It edits the one pinned version it knows and refuses any other text."""

import sys
from pathlib import Path

OPS = ("nms", "qnms")


def main(path: Path) -> None:
    text = path.read_text()
    for op in OPS:
        old = f'@torch.library.register_fake("torchvision::{op}")\n'
        new = (f'@(torch.library.register_fake("torchvision::{op}") '
               "if torchvision.extension._has_ops() else (lambda fn: fn))\n")
        if new in text:
            continue
        if text.count(old) != 1:
            sys.exit(f"{path}: the registration of torchvision::{op} is not as expected")
        text = text.replace(old, new)
    path.write_text(text)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
