"""A fake Google Cloud Storage for tests of ``gs://`` workdirs: ``gcp-storage-emulator``
in this process (in memory), with what orbax and etils need of GCS that it lacks.

* tensorstore (orbax's arrays) takes an object's generation from the ``x-goog-generation``
  header of ``alt=media`` reads; without it an OCDBT manifest's conditional write fails
  ("Malformed StorageGeneration"): media reads get the header.
* gcsfs (etils.epath's ``gs://`` backend without TensorFlow) renames with ``moveTo``,
  which the emulator answers 501 (gcsfs then falls back to copy + delete after ~34 s of
  retries): a ``moveTo`` route copies and deletes.

:func:`start` points tensorstore (``TENSORSTORE_GCS_HTTP_URL``) and gcsfs
(``STORAGE_EMULATOR_HOST``) at it, with no credentials. TFDS cannot write ArrayRecord
files to it (a local ``data_dir`` serves a ``gs://`` workdir).
"""

import logging
import sys
from http import HTTPStatus

from gcp_storage_emulator import server as _server
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import buckets as _buckets
from gcp_storage_emulator.handlers import objects as _objects

_download = _objects.download


def _media_read(request, response, storage, *args, **kwargs):
    """The emulator's download, with the object's generation in the headers."""
    try:
        obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        response["x-goog-generation"] = str(obj["generation"])
        response["x-goog-metageneration"] = str(obj.get("metageneration", "1"))
    except NotFound:
        pass
    return _download(request, response, storage, *args, **kwargs)


def _move(request, response, storage, *args, **kwargs):
    """``POST .../b/B/o/SRC/moveTo/o/DST``: copy, then delete the source."""
    p = request.params
    try:
        moved = _objects._copy(request.base_url, storage, p["bucket_name"], p["object_id"], p["bucket_name"],
                               p["dest_object_id"])
    except NotFound:
        response.status = HTTPStatus.NOT_FOUND
        return
    _objects._delete(storage, p["bucket_name"], p["object_id"])
    response.json(moved)


_objects.download = _media_read
_server.HANDLERS = ((rf"^{_server.settings.API_ENDPOINT}/b/(?P<bucket_name>[-.\w]+)/o/(?P<object_id>.*[^/]+)"
                     r"/moveTo/o/(?P<dest_object_id>.*[^/]+)$", {_server.POST: _move}),) + tuple(
    (route, {m: _media_read if h is _download else h for m, h in handlers.items()})
    for route, handlers in _server.HANDLERS)


def start(buckets=("test-bucket",)):
    """A fake GCS on a free port of localhost holding ``buckets``: (server, the
    environment variables that point tensorstore and gcsfs at it). Set them (e.g. with
    ``monkeypatch.setenv``) before the first ``gs://`` use: fsspec caches its file systems.
    ``server.stop()`` ends it."""
    server = _server.create_server("localhost", 0, in_memory=True)
    for bucket in buckets:
        _buckets.create_bucket(bucket, server._storage)
    server._api.daemon = True              # an unstopped server does not keep the interpreter alive
    server.start()
    httpd = server._api._httpd
    handle_error = httpd.handle_error

    def quiet(request, address):           # clients that close a ranged read early
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            handle_error(request, address)
    httpd.handle_error = quiet
    logging.getLogger("gcp_storage_emulator").setLevel(logging.CRITICAL)      # every 404 is an ERROR line
    url = f"http://localhost:{httpd.server_address[1]}"
    return server, {"TENSORSTORE_GCS_HTTP_URL": url, "GOOGLE_AUTH_TOKEN_FOR_TESTING": "fake",
                    "STORAGE_EMULATOR_HOST": url, "FSSPEC_GCS_TOKEN": "anon",
                    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
