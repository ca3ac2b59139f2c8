"""Each storage emulator is up and speaks its protocol to a plain client (no kolo involved).

These prove the servers from tests/support/emulators.py work on their own, so a failing kolo
store test points at kolo, not at the server.
"""

from __future__ import annotations

import json
import urllib.parse
import uuid
from xml.etree import ElementTree

import pytest
from support.emulators import azure_request, http, webhdfs_url

PAYLOAD = b"kolo emulator check \x00\xff" * 1000


def test_s3_put_get_with_boto3(s3_server):
    boto3 = pytest.importorskip("boto3")
    options = s3_server.storage_options
    client = boto3.client(
        "s3",
        endpoint_url=options["aws_endpoint"],
        aws_access_key_id=options["aws_access_key_id"],
        aws_secret_access_key=options["aws_secret_access_key"],
        region_name=options["aws_region"],
    )
    key = f"check/{uuid.uuid4().hex}.bin"
    client.put_object(Bucket=s3_server.bucket, Key=key, Body=PAYLOAD)
    assert client.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read() == PAYLOAD
    listed = client.list_objects_v2(Bucket=s3_server.bucket, Prefix="check/")
    assert key in [item["Key"] for item in listed["Contents"]]
    assert s3_server.url == f"s3://{s3_server.bucket}"


def test_gcs_upload_download_with_json_api(gcs_server):
    name = f"check/{uuid.uuid4().hex}.bin"
    base = gcs_server.http_url
    status, body, _ = http(
        "POST",
        f"{base}/upload/storage/v1/b/{gcs_server.bucket}/o?uploadType=media"
        f"&name={urllib.parse.quote(name, safe='')}",
        PAYLOAD,
        {"Content-Type": "application/octet-stream"},
    )
    assert status == 200, body
    assert int(json.loads(body)["size"]) == len(PAYLOAD)
    encoded = urllib.parse.quote(name, safe="")
    status, body, _ = http("GET", f"{base}/storage/v1/b/{gcs_server.bucket}/o/{encoded}?alt=media")
    assert status == 200
    assert body == PAYLOAD
    credentials = json.loads(open(gcs_server.storage_options["google_service_account"]).read())
    assert credentials["gcs_base_url"] == gcs_server.endpoint
    assert credentials["disable_oauth"] is True


def test_gcs_xml_api_put_create_only_and_multipart(gcs_server):
    """The XML API calls tests/support/fake-gcs adds on top of fake-gcs-server."""
    url = f"{gcs_server.http_url}/{gcs_server.bucket}/check/{uuid.uuid4().hex}.bin"
    create_only = {"x-goog-if-generation-match": "0"}
    status, _, headers = http("PUT", url, PAYLOAD, create_only)
    assert status == 200
    assert headers["X-Goog-Generation"] != "0"
    assert http("PUT", url, b"again", create_only)[0] == 412
    status, body, headers = http("GET", url)
    assert (status, body) == (200, PAYLOAD)

    status, body, _ = http("POST", f"{url}.multi?uploads", b"")
    assert status == 200, body
    upload_id = ElementTree.fromstring(body).findtext("UploadId")
    parts = []
    for number, chunk in enumerate([PAYLOAD, b"tail"], start=1):
        status, _, headers = http(
            "PUT", f"{url}.multi?partNumber={number}&uploadId={upload_id}", chunk
        )
        assert status == 200
        parts.append(
            f"<Part><PartNumber>{number}</PartNumber><ETag>{headers['ETag']}</ETag></Part>"
        )
    manifest = f"<CompleteMultipartUpload>{''.join(parts)}</CompleteMultipartUpload>".encode()
    status, body, _ = http("POST", f"{url}.multi?uploadId={upload_id}", manifest)
    assert status == 200, body
    assert http("GET", f"{url}.multi")[1] == PAYLOAD + b"tail"


def test_azurite_lists_the_container_and_round_trips_a_blob(azure_server):
    endpoint = azure_server.endpoint
    status, body, _ = azure_request("GET", endpoint, "/", {"comp": "list"})
    assert status == 200, body
    assert f"<Name>{azure_server.bucket}</Name>".encode() in body
    blob = f"/{azure_server.bucket}/check/{uuid.uuid4().hex}.bin"
    status, body, _ = azure_request(
        "PUT", endpoint, blob, body=PAYLOAD, headers={"x-ms-blob-type": "BlockBlob"}
    )
    assert status == 201, body
    status, body, _ = azure_request("GET", endpoint, blob)
    assert status == 200
    assert body == PAYLOAD
    assert azure_server.env["AZURITE_BLOB_STORAGE_URL"] == endpoint.rsplit("/", 1)[0]


def test_minidfs_webhdfs_create_and_read(hdfs_server):
    path = f"/{hdfs_server.bucket}/check/{uuid.uuid4().hex}.bin"
    # WebHDFS CREATE is two steps: the NameNode redirects to a DataNode, which takes the bytes.
    status, _, headers = http(
        "PUT", webhdfs_url(hdfs_server.http_url, path, "CREATE", overwrite="true")
    )
    assert status == 307
    location = headers["Location"]
    assert urllib.parse.urlsplit(location).hostname == "127.0.0.1"
    status, body, _ = http("PUT", location, PAYLOAD, {"Content-Type": "application/octet-stream"})
    assert status == 201, body
    status, _, headers = http("GET", webhdfs_url(hdfs_server.http_url, path, "OPEN"))
    assert status == 307
    status, body, _ = http("GET", headers["Location"])
    assert status == 200
    assert body == PAYLOAD
    status, body, _ = http("GET", webhdfs_url(hdfs_server.http_url, path, "GETFILESTATUS"))
    assert json.loads(body)["FileStatus"]["length"] == len(PAYLOAD)
    assert hdfs_server.url == f"{hdfs_server.endpoint}/{hdfs_server.bucket}"
    assert hdfs_server.endpoint.startswith("hdfs://127.0.0.1:")


def test_prefix_fixtures_are_unique_per_test(remote_prefix):
    assert remote_prefix.url.count("/") >= 3
    assert "test-prefix-fixtures-are-unique-per-test" in remote_prefix.url
