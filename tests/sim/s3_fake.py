"""S3 in process: the result bucket's objects and tags, as the layer's client calls them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError


@dataclass
class StoredObject:
    body: bytes
    content_type: str
    tags: dict[str, str] = field(default_factory=dict)


class S3World:
    def __init__(self, sched: Any, faults: Any) -> None:
        self.sched = sched
        self.faults = faults
        self.objects: dict[tuple[str, str], StoredObject] = {}
        self.uploads: dict[str, tuple[str, str, str, str, dict[int, bytes]]] = {}
        self.client = S3Client(self)

    def call(self, operation: str, key: str) -> None:
        self.sched.point(f"s3 {operation} {key.rsplit('/', 2)[-2] if '/' in key else key}")
        if self.faults.take("s3_error"):
            self.sched.note_fault(f"s3 {operation} failed")
            raise ClientError({"Error": {"Code": "SlowDown", "Message": "simulated"}}, operation)


def _tags(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    return dict(pair.partition("=")[::2] for pair in text.split("&"))


class S3Client:
    def __init__(self, world: S3World) -> None:
        self.world = world

    def put_object(self, *, Bucket: str, Key: str, Body: bytes, ContentType: str = "binary/octet-stream",
                   Tagging: str | None = None, **_: Any) -> dict[str, Any]:
        self.world.call("PutObject", Key)
        self.world.objects[(Bucket, Key)] = StoredObject(bytes(Body), ContentType, _tags(Tagging))
        return {"ETag": '"sim"'}

    def delete_object_tagging(self, *, Bucket: str, Key: str, **_: Any) -> dict[str, Any]:
        self.world.call("DeleteObjectTagging", Key)
        stored = self.world.objects.get((Bucket, Key))
        if stored is None:
            raise ClientError({"Error": {"Code": "NoSuchKey", "Message": "The specified key does not exist."}},
                              "DeleteObjectTagging")
        stored.tags.clear()
        return {}

    def delete_object(self, *, Bucket: str, Key: str, **_: Any) -> dict[str, Any]:
        self.world.call("DeleteObject", Key)
        self.world.objects.pop((Bucket, Key), None)
        return {}

    def create_multipart_upload(self, *, Bucket: str, Key: str, ContentType: str = "binary/octet-stream",
                                Tagging: str | None = None, **_: Any) -> dict[str, Any]:
        self.world.call("CreateMultipartUpload", Key)
        upload = f"u{len(self.world.uploads) + 1}"
        self.world.uploads[upload] = (Bucket, Key, ContentType, Tagging or "", {})
        return {"UploadId": upload}

    def upload_part(self, *, Bucket: str, Key: str, UploadId: str, PartNumber: int, Body: bytes,
                    **_: Any) -> dict[str, Any]:
        self.world.call("UploadPart", Key)
        self.world.uploads[UploadId][4][PartNumber] = bytes(Body)
        return {"ETag": f'"p{PartNumber}"'}

    def complete_multipart_upload(self, *, Bucket: str, Key: str, UploadId: str, **_: Any) -> dict[str, Any]:
        self.world.call("CompleteMultipartUpload", Key)
        bucket, key, content_type, tagging, parts = self.world.uploads.pop(UploadId)
        self.world.objects[(bucket, key)] = StoredObject(b"".join(parts[n] for n in sorted(parts)), content_type,
                                                         _tags(tagging))
        return {}

    def abort_multipart_upload(self, *, Bucket: str, Key: str, UploadId: str, **_: Any) -> dict[str, Any]:
        self.world.call("AbortMultipartUpload", Key)
        self.world.uploads.pop(UploadId, None)
        return {}
