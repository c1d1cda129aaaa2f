"""Input files: gzip, zstd, bzip2 and xz JSONL streamed and counted (known by their first bytes,
whatever their name), a directory or a glob read in a stable order with every row keeping its
file and position, damaged files and compressions fleetgen cannot read refused with their
name."""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from fleetgen.errors import InputError
from producer.inputs import resolve_input
from producer.rows import BadRow, Row, read_rows

LINES = [b'{"id": "r1", "prompt": "one"}', b'{"id": "r2", "prompt": 5}', b"",
         b'{"id": "r4", "messages": [{"role": "user", "content": "four"}]}',
         b'{"id": "r5", "messages": [']


def jsonl_bytes(lines: list[bytes], trailing_newline: bool = True) -> bytes:
    return b"\n".join(lines) + (b"\n" if trailing_newline else b"")


def write(path: Path, data: bytes) -> Path:
    """`data` (JSONL) written as the path's suffix says: .gz, .zst, or plain."""
    if path.name.lower().endswith(".gz"):
        data = gzip.compress(data)
    elif path.name.lower().endswith((".zst", ".zstd")):
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


def summary(items: list[Row | BadRow]) -> list[tuple[int, str, str | None, int | None, str]]:
    return [(i.line, i.id, i.source, i.position,
             "row" if isinstance(i, Row) else i.reason.split(":")[0]) for i in items]


@pytest.mark.parametrize("name", ["p.jsonl", "p.jsonl.gz", "p.jsonl.zst", "p.json.zstd",
                                  "p.ndjson.GZ"])
@pytest.mark.parametrize("trailing_newline", [True, False])
def test_compressed_and_plain_jsonl_give_the_same_rows(
        tmp_path: Path, name: str, trailing_newline: bool) -> None:
    path = write(tmp_path / name, jsonl_bytes(LINES, trailing_newline))
    items = list(read_rows(path))
    assert summary(items) == [(1, "r1", None, 1, "row"), (2, "r2", None, 2, "bad_prompt"),
                              (3, "line-3", None, 3, "empty_line"),
                              (4, "r4", None, 4, "row"), (5, items[4].id, None, 5,
                                                          "invalid_json")]


def test_zstd_of_several_frames_is_read_whole(tmp_path: Path) -> None:
    # `zstd` writes one frame per input when files are concatenated, and so do parallel
    # compressors: every frame's lines must be read, as `zstd -d` would.
    rows = [f'{{"id": "z{i}", "prompt": "p{i}"}}\n'.encode() for i in range(3000)]
    cctx = zstandard.ZstdCompressor()
    path = tmp_path / "multi.jsonl.zst"
    path.write_bytes(b"".join(cctx.compress(b"".join(rows[i:i + 700]))
                             for i in range(0, 3000, 700)))
    items = list(read_rows(path))
    assert [i.id for i in items] == [f"z{i}" for i in range(3000)]


def test_gzip_of_several_members_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "cat.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"id": "a", "prompt": "x"}\n')
                     + gzip.compress(b'{"id": "b", "prompt": "y"}\n'))
    assert [i.id for i in read_rows(path)] == ["a", "b"]


@pytest.mark.parametrize("name", ["cut.jsonl.gz", "cut.jsonl.zst"])
def test_a_truncated_compressed_file_is_refused_not_taken_as_shorter(tmp_path: Path,
                                                                     name: str) -> None:
    rows = b"".join(f'{{"id": "t{i}", "prompt": "{"x" * (i % 50)}"}}\n'.encode()
                    for i in range(20000))
    whole = write(tmp_path / ("whole-" + name), rows).read_bytes()
    path = tmp_path / name
    path.write_bytes(whole[: len(whole) * 2 // 3])
    with pytest.raises(InputError, match=f"cannot read .*{name}.*damaged or truncated.*"
                                         r"after line \d+"):
        list(read_rows(path))


@pytest.mark.parametrize("name", ["junk.jsonl.gz", "junk.jsonl.zst"])
def test_a_file_that_is_not_what_its_name_says_is_refused(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(b'{"id": "plain", "prompt": "not compressed"}\n')
    with pytest.raises(InputError, match=name):
        list(read_rows(path))


@pytest.mark.parametrize("name", ["p.jsonl.lz4", "p.jsonl.lzma", "p.zip"])
def test_a_compression_fleetgen_does_not_read_is_refused_by_name(tmp_path: Path,
                                                                 name: str) -> None:
    (tmp_path / name).write_bytes(b"\x00\x01 no magic fleetgen knows")
    suffix = "." + name.rsplit(".", 1)[1]
    with pytest.raises(InputError, match=f"{suffix} is not supported"):
        resolve_input(tmp_path / name)
    # In a directory too, when the name says JSONL: skipping it would lose its rows without
    # a word. (A .zip is not taken for prompts: the directory has no input file.)
    with pytest.raises(InputError, match=f"{suffix} is not supported" if ".jsonl" in name
                       else "no input files in directory"):
        resolve_input(tmp_path)


COMPRESSORS = {"gzip": gzip.compress, "zstd": zstandard.ZstdCompressor().compress,
               "bzip2": bz2.compress, "xz": lzma.compress}


@pytest.mark.parametrize("compression", sorted(COMPRESSORS))
@pytest.mark.parametrize("name", ["p.jsonl", "prompts.txt", "p.jsonl.bz2", "p.jsonl.xz"])
def test_compression_is_known_by_the_first_bytes_whatever_the_name(
        tmp_path: Path, compression: str, name: str) -> None:
    """A gzip file named .jsonl used to be read as text: two invalid_utf8 rejections for ten
    rows, and a run called complete."""
    rows = [orjson.dumps({"id": f"r{i}", "prompt": f"row {i}"}) for i in range(10)]
    path = tmp_path / name
    path.write_bytes(COMPRESSORS[compression](jsonl_bytes(rows)))
    assert resolve_input(path).files[0].compression == compression
    read = list(read_rows(path))
    assert [r.id for r in read if isinstance(r, Row)] == [f"r{i}" for i in range(10)]


@pytest.mark.parametrize(("kind", "data"), [
    ("zip", None), ("lz4", b"\x04\x22\x4d\x18\x64\x40\xa7rest"),
    ("7z", b"7z\xbc\xaf\x27\x1c\x00\x04rest")])
def test_a_compression_fleetgen_cannot_read_is_refused_by_its_bytes_naming_it(
        tmp_path: Path, kind: str, data: bytes | None) -> None:
    path = tmp_path / "p.jsonl"
    if data is None:
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("p.jsonl", b'{"id": "a", "prompt": "x"}\n')
    else:
        path.write_bytes(data)
    with pytest.raises(InputError, match=f"{path}: it is {kind}-compressed"):
        resolve_input(path)


def test_compressed_parquet_is_refused_by_its_bytes(tmp_path: Path) -> None:
    plain = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": ["a"], "prompt": ["x"]}), plain)
    hidden = tmp_path / "p.parquet"
    hidden.write_bytes(gzip.compress(plain.read_bytes()))
    with pytest.raises(InputError, match="Parquet compresses its own pages"):
        resolve_input(hidden)


def make_tree(root: Path) -> None:
    """Files out of order, with names that sort differently as text and as numbers."""
    root.mkdir()
    write(root / "part-10.jsonl", b'{"id": "p10", "prompt": "x"}\n')
    write(root / "part-9.jsonl.gz", b'{"id": "p9a", "prompt": "x"}\n{"id": "p9b", "prompt": 1}\n')
    write(root / "part-2.jsonl.zst", b'{"id": "p2", "prompt": "x"}\n')
    pq.write_table(pa.table({"id": ["q1", "q2"], "prompt": ["a", None]}), root / "b.parquet")
    (root / "README.md").write_text("not prompts")
    (root / ".part-0.jsonl").write_text('{"id": "hidden", "prompt": "x"}\n')
    (root / "sub").mkdir()
    write(root / "sub" / "deep.jsonl", b'{"id": "deep", "prompt": "x"}\n')


def test_a_directory_is_read_in_name_order_and_each_row_keeps_its_file_and_position(
        tmp_path: Path) -> None:
    root = tmp_path / "data"
    make_tree(root)
    inputs = resolve_input(root)
    # Code-point order of the names: stable whatever order the directory lists them in.
    assert inputs.names == ["b.parquet", "part-10.jsonl", "part-2.jsonl.zst", "part-9.jsonl.gz"]
    assert inputs.several
    items = list(read_rows(root))
    assert summary(items) == [
        (1, "q1", "b.parquet", 1, "row"), (2, items[1].id, "b.parquet", 2, "no_prompt"),
        (3, "p10", "part-10.jsonl", 1, "row"), (4, "p2", "part-2.jsonl.zst", 1, "row"),
        (5, "p9a", "part-9.jsonl.gz", 1, "row"), (6, "p9b", "part-9.jsonl.gz", 2, "bad_prompt"),
    ]
    assert len(items) == 6


def test_the_order_does_not_depend_on_the_order_files_were_created(tmp_path: Path) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    first.mkdir()
    second.mkdir()
    names = ["c.jsonl", "a.jsonl", "b.jsonl.gz"]
    for name in names:
        write(first / name, f'{{"id": "{name}", "prompt": "x"}}\n'.encode())
    for name in reversed(names):
        write(second / name, f'{{"id": "{name}", "prompt": "x"}}\n'.encode())
    assert [r.id for r in read_rows(first)] == [r.id for r in read_rows(second)] == [
        "a.jsonl", "b.jsonl.gz", "c.jsonl"]


def test_a_glob_selects_files_and_names_them_from_its_fixed_part(tmp_path: Path) -> None:
    root = tmp_path / "data"
    make_tree(root)
    assert resolve_input(f"{root}/part-*").names == [
        "part-10.jsonl", "part-2.jsonl.zst", "part-9.jsonl.gz"]
    # ** reaches subdirectories; the names keep their directory.
    assert resolve_input(f"{root}/**/*.jsonl").names == ["part-10.jsonl", "sub/deep.jsonl"]
    items = list(read_rows(f"{root}/**/*.jsonl"))
    assert summary(items) == [(1, "p10", "part-10.jsonl", 1, "row"),
                              (2, "deep", "sub/deep.jsonl", 1, "row")]
    # A relative glob works from the current directory, as a shell's would.
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        assert resolve_input("data/*.parquet").names == ["b.parquet"]
    finally:
        os.chdir(cwd)


def test_one_file_named_alone_has_no_source(tmp_path: Path) -> None:
    path = write(tmp_path / "p.jsonl.gz", b'{"id": "a", "prompt": "x"}\n')
    inputs = resolve_input(path)
    assert not inputs.several and inputs.names == ["p.jsonl.gz"]
    [row] = read_rows(path)
    assert row.source is None and row.position == 1


def test_a_single_file_of_another_suffix_is_read_as_jsonl(tmp_path: Path) -> None:
    path = write(tmp_path / "prompts.txt", b'{"id": "a", "prompt": "x"}\n')
    assert [r.id for r in read_rows(path)] == ["a"]


@pytest.mark.parametrize(("spec", "message"), [
    ("{tmp}/missing.jsonl", "input file not found"),
    ("{tmp}/nothing-*.jsonl", "no input files match"),
    ("{tmp}/empty", "no input files in directory"),
    ("{tmp}/only-text", "no input files in directory"),
    ("{tmp}/only-text/*", "none of them"),
])
def test_nothing_to_read_is_one_input_error(tmp_path: Path, spec: str, message: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "only-text").mkdir()
    (tmp_path / "only-text" / "notes.txt").write_text("hi")
    with pytest.raises(InputError, match=message) as caught:
        resolve_input(spec.format(tmp=tmp_path))
    assert "\n" not in str(caught.value)


def test_a_parquet_file_without_a_prompt_column_fails_up_front_in_a_directory(
        tmp_path: Path) -> None:
    write(tmp_path / "a.jsonl", b'{"id": "a", "prompt": "x"}\n')
    pq.write_table(pa.table({"question": ["q"]}), tmp_path / "b.parquet")
    with pytest.raises(InputError, match=r"b\.parquet has none of the columns"):
        list(read_rows(tmp_path))


def test_compressed_parquet_is_refused(tmp_path: Path) -> None:
    (tmp_path / "t.parquet.gz").write_bytes(b"x")
    with pytest.raises(InputError, match="Parquet compresses its own pages"):
        resolve_input(tmp_path / "t.parquet.gz")


def test_parquet_bad_rows_carry_their_row_position(tmp_path: Path) -> None:
    table = pa.table({"id": ["ok", "no-prompt", "bad-turns", "ok2"],
                      "messages": [[{"role": "user", "content": "hi"}], None,
                                   [{"role": "alien", "content": "x"}],
                                   [{"role": "user", "content": "yo"}]]})
    # Small row groups: positions run on across them.
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=1)
    items = list(read_rows(tmp_path / "t.parquet"))
    assert summary(items) == [(1, "ok", None, 1, "row"), (2, "no-prompt", None, 2, "no_prompt"),
                              (3, "bad-turns", None, 3, "bad_messages"), (4, "ok2", None, 4, "row")]


def test_huge_lines_in_a_compressed_file_are_rejected_with_their_position(
        tmp_path: Path) -> None:
    from producer.rows import MAX_LINE_BYTES

    huge = orjson.dumps({"id": "huge", "prompt": "x" * (MAX_LINE_BYTES + 10)})
    path = write(tmp_path / "h.jsonl.zst", jsonl_bytes([b'{"id": "a", "prompt": "x"}', huge,
                                                        b'{"id": "b", "prompt": "y"}']))
    items = list(read_rows(path))
    assert summary(items)[1][3:] == (2, "line_too_long") and items[2].id == "b"


PARQUET_PEAK = """
import resource, sys
import pyarrow as pa
from producer.rows import Row, read_rows
rows = sum(isinstance(r, Row) for r in read_rows(sys.argv[1]))
print(rows, pa.default_memory_pool().max_memory(),
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def parquet_peak(path: Path) -> tuple[int, int, int]:
    """(rows read, pyarrow's peak allocation, peak RSS) of reading `path` in a fresh process."""
    done = subprocess.run([sys.executable, "-c", PARQUET_PEAK, str(path)], capture_output=True,
                          text=True, timeout=120, check=True,
                          cwd=Path(__file__).resolve().parents[2])
    rows, arrow, rss = (int(v) for v in done.stdout.split())
    return rows, arrow, rss


def write_parquet_groups(path: Path, groups: int, rows: int = 1000) -> int:
    """`groups` row groups of `rows` rows of ~1.2 kB of incompressible text; the file's size."""
    writer = None
    for g in range(groups):
        table = pa.table({"id": [f"g{g}-{i}" for i in range(rows)],
                          "prompt": [os.urandom(600).hex() for _ in range(rows)]})
        writer = writer or pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
    assert writer is not None
    writer.close()
    return path.stat().st_size


def test_parquet_memory_stays_flat_in_the_file_size(tmp_path: Path) -> None:
    small_size = write_parquet_groups(tmp_path / "small.parquet", 3)
    big_size = write_parquet_groups(tmp_path / "big.parquet", 36)
    small, big = parquet_peak(tmp_path / "small.parquet"), parquet_peak(tmp_path / "big.parquet")
    assert (small[0], big[0]) == (3000, 36000)
    # 12x the file, the same memory: one row group (~1.2 MB here) at a time. pyarrow's
    # default read-ahead (pre_buffer) held ~the whole file: 50 MB here.
    assert big[1] < 1.5 * small[1] + 1_000_000, (small, big)
    assert big[1] < big_size / 5, (big, big_size)
    assert big[2] - small[2] < big_size / 3, (small, big, small_size, big_size)


def test_a_damaged_parquet_row_group_is_one_input_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "dmg.parquet"
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(300)],
                             "prompt": [f"text {i} " * 20 for i in range(300)]}),
                   path, row_group_size=100)
    column = pq.ParquetFile(path).metadata.row_group(2).column(1)
    start = column.dictionary_page_offset or column.data_page_offset
    data = bytearray(path.read_bytes())
    data[start:start + column.total_compressed_size] = b"\xff" * column.total_compressed_size
    path.write_bytes(bytes(data))
    read: list[str] = []
    with pytest.raises(InputError, match=r"dmg\.parquet: row group 2 \(rows from 201\) is "
                                         r"damaged") as caught:
        for row in read_rows(path):
            read.append(row.id)
    assert "\n" not in str(caught.value)
    assert read == [f"r{i}" for i in range(200)]  # the groups before it were read whole
