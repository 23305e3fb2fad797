"""The session's S3 server answers as an object store: what is put is read back."""

import s3fs


def test_the_local_s3_server_stores_and_returns_objects(s3_bucket):
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.pipe(f"{s3_bucket}/a/b.bin", b"\x00\x01dl1")
    assert fs.cat(f"{s3_bucket}/a/b.bin") == b"\x00\x01dl1"
    assert fs.ls(f"{s3_bucket}/a", detail=False) == [f"{s3_bucket[5:]}/a/b.bin"]
