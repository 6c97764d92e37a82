"""The commit protocol trusts nothing it did not just check (commit.py): --resume verifies every committed part and
the plan, names in bookkeeping files stay inside the folder, and read_parts verifies what the manifest promises.
No Ray here: the jobs are made with commit.Job and ray_engine.write_part directly."""

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import need

from paraphrastic import commit, embed_sentences
from paraphrastic.fileio import InputError

pa = need("pyarrow")
pq = need("pyarrow.parquet")
from paraphrastic import ray_engine  # noqa: E402 (after pyarrow is known to be there)

ITEMS, ROWS = 3, 4


def spec_of(items: int = ITEMS, rows: int = ROWS) -> dict:
    plan = [{"file": "a.txt", "first": k * rows, "lines": rows} for k in range(items)]
    return {"kind": "embed", "inputs": [], "model": {}, "options": {}, "items": plan}


def part_table(first: int, rows: int = ROWS, seed: int = 0):
    vectors = np.random.default_rng(seed + first).normal(size=(rows, 8)).astype(np.float32)
    column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), 8)
    return ray_engine.keyed("a.txt", first, rows).append_column("vector", column)


def committed_job(out: Path, seed: int = 0) -> commit.Job:
    """A job of ITEMS items, each with one staged part, all committed: as the engine leaves it before publishing."""
    job = commit.Job.open(out, spec_of())
    for k in range(ITEMS):
        name = f"part-{k:06d}-00000.parquet"
        size, digest = ray_engine.write_part(job.staging / (name + commit.STAGED), part_table(k * ROWS, seed=seed))
        job.commit({"item": k, "file": "a.txt", "parts": [name], "part_rows": [ROWS], "part_bytes": [size],
                    "part_sha256": [digest], "bad_lines": 0, "shown_bad": [], "invalid_utf8_lines": 0})  # fmt: skip
    return job


def finished(out: Path, seed: int = 0) -> Path:
    job = committed_job(out, seed)
    job.publish(job.committed(), {"bad_lines": 0, "invalid_utf8_lines": 0})
    return out


def test_resume_runs_again_each_item_whose_part_is_damaged_or_replaced(tmp_path):
    committed_job(tmp_path / "other", seed=1).release(keep=True)
    job = committed_job(tmp_path / "o")
    job.release(keep=True)  # as a killed run leaves it
    staged = [job.staging / f"part-{k:06d}-00000.parquet{commit.STAGED}" for k in range(ITEMS)]
    with open(staged[0], "r+b") as f:
        f.truncate(100)
    other = tmp_path / "other" / commit.STAGING / staged[1].name
    shutil.copyfile(other, staged[1])  # another run's valid part of the same item and size
    assert other.stat().st_size == job.staging.joinpath(staged[2].name).stat().st_size
    resumed = commit.Job.open(tmp_path / "o", spec_of(), resume=True)
    assert sorted(resumed.committed()) == [2]
    assert sorted(p.name for p in (resumed.staging / "items").iterdir()) == ["000002.json"]


def test_a_record_naming_a_file_outside_the_folder_moves_nothing(tmp_path):
    victim = tmp_path / "outside2" / "victim.txt"
    victim.parent.mkdir()
    victim.write_text("keep me")
    job = committed_job(tmp_path / "o")
    record = json.loads((job.staging / "items" / "000001.json").read_text())
    for name in ("../../outside2/victim.txt", "/etc/passwd", "part-000002-00000.parquet", "x.parquet"):
        forged = record | {"parts": [name]}
        (job.staging / "items" / "000001.json").write_text(json.dumps(forged))
        job.release(keep=True)
        job = commit.Job.open(tmp_path / "o", spec_of(), resume=True)
        records = job.committed()
        assert sorted(records) == [0, 2], name  # the forged record is dropped: its item runs again
        job.commit(record)  # as the rerun commits it
    job.publish(job.committed(), {"bad_lines": 0, "invalid_utf8_lines": 0})
    assert victim.read_text() == "keep me"
    assert ray_engine.read_parts(tmp_path / "o").num_rows == ITEMS * ROWS


def test_resume_refuses_a_run_planned_into_other_work_items(tmp_path):
    committed_job(tmp_path / "o").release(keep=True)
    with pytest.raises(InputError, match="other work items"):  # LINES_PER_ITEM 20,000 then 30,000
        commit.Job.open(tmp_path / "o", spec_of(items=2, rows=6), resume=True)


@pytest.mark.parametrize("how", ["grown", "bytes flipped, size and time kept", "replaced by a copy of itself"])
def test_a_part_changed_under_the_run_is_caught_before_publishing(tmp_path, how):
    """Before publishing, a committed part changed in any way is caught without hashing it (its stamp: inode,
    modification and change times): grown, flipped in place with its modification time set back, or replaced by
    a file of the same bytes (another inode: what a swap or a restore looks like)."""
    job = committed_job(tmp_path / "o")
    records = job.committed()  # as the driver holds them
    part = job.staging / f"part-000001-00000.parquet{commit.STAGED}"
    stat, data = part.stat(), bytearray(part.read_bytes())
    if how == "grown":
        with open(part, "ab") as f:
            f.write(b"more")
    elif how.startswith("bytes flipped"):
        data[100:108] = bytes(255 - x for x in data[100:108])
        part.write_bytes(data)
        os.utime(part, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    else:
        shutil.copy2(part, tmp_path / "copy")
        os.replace(tmp_path / "copy", part)
    with pytest.raises(commit.Damaged, match="part-000001-00000.parquet.staged: changed under the run"):
        job.check_staged(records)
    assert sorted(job.committed()) == [0, 2]  # its item runs again on --resume


def test_parts_checked_before_publishing_are_left_as_they_are(tmp_path):
    """Reading a committed part, or a resumed run's check of it, changes nothing the stamp sees: publishing goes on."""
    job = committed_job(tmp_path / "o")
    records = job.committed()
    (job.staging / f"part-000001-00000.parquet{commit.STAGED}").read_bytes()
    job.check_staged(records)
    job.publish(records, {"bad_lines": 0, "invalid_utf8_lines": 0})
    assert ray_engine.read_parts(tmp_path / "o").num_rows == ITEMS * ROWS


def damage(folder: Path, how: str) -> None:
    parts = sorted(folder.glob("part-*.parquet"))
    if how == "swapped":
        parts[0].rename(folder / "tmp")
        parts[1].rename(parts[0])
        (folder / "tmp").rename(parts[1])
    elif how == "replaced by another run's part":
        shutil.copyfile(folder.parent / "other" / parts[1].name, parts[1])
    elif how == "bytes flipped":
        data = bytearray(parts[1].read_bytes())
        data[8:72] = bytes(255 - b for b in data[8:72])
        parts[1].write_bytes(data)
    elif how == "truncated":
        with open(parts[2], "r+b") as f:
            f.truncate(parts[2].stat().st_size // 2)
    elif how == "any Parquet file of its rows":
        nulls = pa.table({"file": ["a.txt"] * ROWS, "line": list(range(ROWS)), "vector": pa.nulls(ROWS)})
        pq.write_table(nulls, parts[0])
    else:  # the manifest's entries malformed
        manifest = commit.read_manifest(folder / commit.MANIFEST)
        manifest["parts"][1] = {"name": ["part-000001-00000.parquet"], "rows": "4"} if how == "entry" else "x"
        commit.write_manifest(folder, manifest)


@pytest.mark.parametrize("how", ["swapped", "replaced by another run's part", "bytes flipped", "truncated",
                                 "any Parquet file of its rows", "entry", "string"])  # fmt: skip
def test_read_parts_refuses_a_folder_that_is_not_what_its_manifest_promises(tmp_path, how):
    finished(tmp_path / "other", seed=1)
    out = finished(tmp_path / "o")
    want = ray_engine.read_parts(out)
    assert want.num_rows == ITEMS * ROWS and want.column("line").to_pylist() == list(range(ITEMS * ROWS))
    damage(out, how)
    with pytest.raises(InputError) as refused:
        ray_engine.read_parts(out)
    message = str(refused.value)
    assert "\n" not in message and str(out) in message
    assert "part" in message and ("manifest" in message or "written" in message or "size" in message)


def test_an_empty_job_reads_as_empty(tmp_path):
    job = commit.Job.open(tmp_path / "o", spec_of(items=0))
    job.publish({}, {"bad_lines": 0, "invalid_utf8_lines": 0})
    assert ray_engine.read_parts(tmp_path / "o").num_rows == 0
    assert ray_engine.read_parts(tmp_path / "o", columns=["line"]).column_names == ["line"]


@pytest.mark.parametrize("name", [commit.DONE, "part-000000-00000.parquet", f"{commit.STAGING}/x.npy"])
def test_a_local_command_never_writes_into_a_parts_folder(tmp_path, capsys, name):
    out = finished(tmp_path / "o")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    (out / commit.STAGING).mkdir(exist_ok=True)
    sentences = tmp_path / "s.txt"
    sentences.write_text("a man plays\n")
    args = ["--sentence-file", str(sentences), "--output-file", str(out / name), "--quiet"]
    assert embed_sentences.main(args) == 2
    assert "an output folder of --engine ray; write the output elsewhere" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_inputs_a_literal_bracket_name_a_non_utf8_name_and_a_proc_file(tmp_path):
    """`names/[x].txt` that exists is that file (it was taken as a glob: "no file matches"); a name with byte 0xFF
    and /proc/cpuinfo (its size is not its length) are one error each before any work."""
    (tmp_path / "[x].txt").write_text("a man\n")
    assert ray_engine.input_files([str(tmp_path / "[x].txt")]) == [tmp_path / "[x].txt"]
    odd = os.fsdecode(bytes(tmp_path) + b"/caf\xff.txt")
    Path(odd).write_text("a man\n")
    with pytest.raises(InputError, match="not UTF-8, which Ray cannot pass"):
        ray_engine.input_files([odd])
    if Path("/proc/cpuinfo").exists():
        with pytest.raises(InputError, match="a /proc or /sys file"):
            ray_engine.input_files(["/proc/cpuinfo"])


def test_a_failure_under_ray_is_the_remote_errors_first_line():
    class RemoteError(Exception):  # as Ray's RayTaskError: its text holds the remote traceback, `cause` the error
        cause = OSError(28, "No space left on device")

    error = RemoteError("ray::Parts.run_item()\nTraceback (most recent call last):\n  File ...\nOSError: ...")
    assert ray_engine.one_line(error) == "[Errno 28] No space left on device"
    assert ray_engine.one_line(ValueError("\n  first\nsecond")) == "first"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
