"""OpenMetadata's own OpenLineage connector (openmetadata-ingestion, run unpatched) for the
end-to-end suite: installed in a virtual environment of its own, fed from a real Kafka topic,
with its server faked as a catalogue of tables.

``connector_python()`` builds (once, cached under ``$LINEAGE_OUTBOX_PEERS_CACHE``) a virtual
environment from ``requirements-openmetadata.txt``: the package and the modules its connector
and workflow import, each installed without dependencies (the package's full dependency set
builds one from sources, which downloads from the internet).  ``FakeOpenMetadata`` serves the
part of OpenMetadata's REST API the workflow uses: the version, the database services and
tables of a catalogue given to it (and the search that finds them), the pipeline services and
pipelines the workflow creates, and the lineage edges it adds, reads and deletes.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from e2e.peers import CACHE, wait_for_http

HERE = Path(__file__).parent
REQUIREMENTS = HERE / "requirements-openmetadata.txt"
RUNNER = HERE / "openmetadata_runner.py"
VERSION = "2.0.7"


def connector_python() -> str:
    """The interpreter of a virtual environment holding openmetadata-ingestion's connector,
    made once per requirements file (its hash names the folder) and then reused."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    venv = CACHE / f"openmetadata-{digest}"
    python = venv / "bin" / "python"
    if (venv / "installed").exists():
        return str(python)
    print(f"\ninstalling OpenMetadata's connector into {venv} (once)", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    result = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "-r", str(REQUIREMENTS)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(f"pip could not install {REQUIREMENTS.name}:\n{result.stderr[-3000:]}")
    check = subprocess.run(
        [str(python), "-W", "ignore", "-c", "import metadata.ingestion.source.pipeline.openlineage.metadata"],
        capture_output=True,
        text=True,
    )
    if check.returncode != 0:
        raise RuntimeError(f"the connector does not import:\n{check.stderr[-3000:]}")
    (venv / "installed").write_text("ok\n")
    return str(python)


def run_connector(server_url: str, bootstrap_servers: str, topic: str, services: list[str]) -> dict[str, Any]:
    """Run OpenMetadata's ingestion workflow with its OpenLineage source over ``topic`` once
    (until the topic has been idle for its session timeout); its status, as the runner prints it."""
    config = {
        "source": {
            "type": "openlineage",
            "serviceName": "vast_openlineage",
            "serviceConnection": {
                "config": {
                    "type": "OpenLineage",
                    "brokerConfig": {
                        "brokersUrl": bootstrap_servers,
                        "topicName": topic,
                        "consumerGroupName": f"openmetadata-{uuid.uuid4().hex[:8]}",
                        "consumerOffsets": "earliest",
                        "poolTimeout": 0.5,
                        "sessionTimeout": 5,
                        "securityProtocol": "PLAINTEXT",
                    },
                }
            },
            "sourceConfig": {
                "config": {"type": "PipelineMetadata", "lineageInformation": {"dbServiceNames": services}}
            },
        },
        "sink": {"type": "metadata-rest", "config": {}},
        "workflowConfig": {
            "loggerLevel": os.environ.get("LINEAGE_OUTBOX_OPENMETADATA_LOG", "INFO"),
            "openMetadataServerConfig": {
                "hostPort": f"{server_url}/api",
                "authProvider": "openmetadata",
                "securityConfig": {"jwtToken": "e2e-bot-token"},
            },
        },
    }
    result = subprocess.run(
        [connector_python(), "-W", "ignore", str(RUNNER)],
        input=json.dumps(config),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        raise RuntimeError(f"the connector failed ({result.returncode}):\n{result.stderr[-5000:]}")
    status: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    status["log"] = result.stderr
    return status


class FakeOpenMetadata:
    """OpenMetadata's REST API, as far as the ingestion workflow uses it, over a catalogue of
    tables (``service.database.schema.table``, each service of ``service_type``)."""

    def __init__(self, tables: list[str], service_type: str = "Trino") -> None:
        self._lock = threading.Lock()
        self.service_type = service_type
        self.tables = {fqn: self._table(fqn) for fqn in tables}
        self.entities: dict[str, dict[str, Any]] = {}  # kind/fqn -> entity the workflow created
        #: (from fqn, to fqn, lineageDetails) of every edge present now.
        self.edges: dict[tuple[str, str], dict[str, Any]] = {}
        #: (method, path) the fake did not know, for the failure message.
        self.unknown: list[tuple[str, str]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, status: int, body: Any) -> None:
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _body(self) -> Any:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length)) if length else None

            def do_GET(self) -> None:
                self._send(*fake.get(urlsplit(self.path)))

            def do_PUT(self) -> None:
                self._send(*fake.put(urlsplit(self.path).path, self._body()))

            def do_POST(self) -> None:
                self._send(*fake.put(urlsplit(self.path).path, self._body()))

            def do_PATCH(self) -> None:
                self._body()
                self._send(*fake.get(urlsplit(self.path)))

            def do_DELETE(self) -> None:
                self._send(*fake.delete(urlsplit(self.path).path))

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FakeOpenMetadata:
        self._thread.start()
        try:  # used once it answers, as the connector's first call does
            wait_for_http("the fake OpenMetadata server", f"{self.url}/api/v1/system/version", 30)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- entities ---------------------------------------------------------------------------

    @staticmethod
    def _id(kind: str, fqn: str) -> str:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{kind}:{fqn}"))

    def _table(self, fqn: str) -> dict[str, Any]:
        service, _database, _schema, name = fqn.split(".")
        return {
            "id": self._id("table", fqn),
            "name": name,
            "fullyQualifiedName": fqn,
            "columns": [{"name": "id", "dataType": "INT"}],
            "databaseSchema": {"id": self._id("schema", fqn), "type": "databaseSchema"},
            "database": {"id": self._id("database", fqn), "type": "database"},
            "service": {"id": self._id("service", service), "type": "databaseService", "name": service},
        }

    def _by_id(self, entity_id: str) -> dict[str, Any] | None:
        for entity in [*self.tables.values(), *self.entities.values()]:
            if entity["id"] == entity_id:
                return entity
        return None

    def fqn_of(self, entity_id: str) -> str:
        entity = self._by_id(entity_id)
        return entity["fullyQualifiedName"] if entity else entity_id

    # -- routes -----------------------------------------------------------------------------

    def get(self, url: Any) -> tuple[int, Any]:
        path = unquote(url.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        with self._lock:
            if path == "/api/v1/system/version":
                return 200, {"version": VERSION, "revision": "e2e", "timestamp": 0}
            if path == "/api/v1/services/testConnectionDefinitions/name/OpenLineage.testConnectionDefinition":
                # The server's definition (testConnections/pipeline/openlineage.json): one step.
                return 200, {
                    "id": self._id("testConnectionDefinition", "OpenLineage"),
                    "name": "OpenLineage",
                    "fullyQualifiedName": "OpenLineage.testConnectionDefinition",
                    "steps": [
                        {
                            "name": "CheckBrokerConnectivity",
                            "description": "Reach the broker and read the topic's offsets",
                            "mandatory": True,
                        }
                    ],
                }
            if path.startswith("/api/v1/services/databaseServices/name/"):
                name = path.rsplit("/", 1)[1]
                if any(fqn.split(".")[0] == name for fqn in self.tables):
                    return 200, {
                        "id": self._id("service", name),
                        "name": name,
                        "fullyQualifiedName": name,
                        "serviceType": self.service_type,
                    }
                return 404, {"code": 404, "message": f"databaseService instance for {name} not found"}
            if path.startswith("/api/v1/tables/name/"):
                fqn = path[len("/api/v1/tables/name/") :]
                table = self.tables.get(fqn)
                return (200, table) if table else (404, {"code": 404, "message": f"table {fqn} not found"})
            if path == "/api/v1/search/fieldQuery":
                pattern = query.get("fieldValue", "")
                hits = [
                    {"_source": {"fullyQualifiedName": fqn}}
                    for fqn in self.tables
                    if query.get("index", "").startswith("table") and fnmatch.fnmatchcase(fqn, pattern)
                ]
                return 200, {"hits": {"total": {"value": len(hits)}, "hits": hits}}
            for kind in ("services/pipelineServices", "pipelines"):
                prefix = f"/api/v1/{kind}/name/"
                if path.startswith(prefix):
                    entity = self.entities.get(f"{kind}/{path[len(prefix) :]}")
                    return (200, entity) if entity else (404, {"code": 404, "message": "not found"})
            if path.startswith("/api/v1/lineage/getLineageEdge/"):
                from_id, to_id = path.split("/")[-2:]
                found = [
                    v
                    for v in self.edges.values()
                    if (v["fromEntity"]["id"], v["toEntity"]["id"]) == (from_id, to_id)
                ]
                return (
                    (200, {"edge": found[0]["lineageDetails"]})
                    if found
                    else (404, {"code": 404, "message": "no edge"})
                )
            if path.startswith("/api/v1/lineage/"):
                return 200, self._lineage(path.split("/")[-1])
            self.unknown.append(("GET", url.path))
            return 404, {"code": 404, "message": f"the fake has no GET {url.path}"}

    def put(self, path: str, body: Any) -> tuple[int, Any]:
        with self._lock:
            if path == "/api/v1/services/pipelineServices":
                return 200, self._create("services/pipelineServices", body["name"], body)
            if path == "/api/v1/pipelines":
                fqn = f"{body['service']}.{_quote(body['name'])}"
                entity = self._create("pipelines", fqn, body)
                entity["service"] = {"id": self._id("service", body["service"]), "type": "pipelineService"}
                return 200, entity
            if path == "/api/v1/lineage":
                edge = body["edge"]
                key = (self.fqn_of(edge["fromEntity"]["id"]), self.fqn_of(edge["toEntity"]["id"]))
                self.edges[key] = {
                    "fromEntity": edge["fromEntity"],
                    "toEntity": edge["toEntity"],
                    "lineageDetails": edge.get("lineageDetails") or {},
                }
                return 200, {}
            if path.startswith("/api/v1/usage/"):
                return 200, {}  # the workflow's closing usage computation: nothing to keep
            self.unknown.append(("PUT", path))
            return 404, {"code": 404, "message": f"the fake has no PUT {path}"}

    def delete(self, path: str) -> tuple[int, Any]:
        parts = unquote(path).split("/")
        with self._lock:
            if path.startswith("/api/v1/lineage/") and len(parts) >= 8:
                self.edges.pop((self.fqn_of(parts[-3]), self.fqn_of(parts[-1])), None)
                return 200, {}
            self.unknown.append(("DELETE", path))
            return 404, {"code": 404, "message": f"the fake has no DELETE {path}"}

    def _create(self, kind: str, fqn: str, body: dict[str, Any]) -> dict[str, Any]:
        entity = {**body, "id": self._id(kind, fqn), "fullyQualifiedName": fqn}
        self.entities[f"{kind}/{fqn}"] = entity
        return entity

    def _lineage(self, entity_id: str) -> dict[str, Any]:
        def edge(key: tuple[str, str], value: dict[str, Any]) -> dict[str, Any]:
            return {
                "fromEntity": value["fromEntity"]["id"],
                "toEntity": value["toEntity"]["id"],
                "lineageDetails": value["lineageDetails"],
            }

        entity = self._by_id(entity_id) or {"id": entity_id}
        return {
            "entity": {
                "id": entity_id,
                "type": "table",
                "fullyQualifiedName": entity.get("fullyQualifiedName"),
            },
            "nodes": [],
            "upstreamEdges": [edge(k, v) for k, v in self.edges.items() if v["toEntity"]["id"] == entity_id],
            "downstreamEdges": [
                edge(k, v) for k, v in self.edges.items() if v["fromEntity"]["id"] == entity_id
            ],
        }


def _quote(name: str) -> str:
    """A name in an FQN, as OpenMetadata quotes it (one holding a dot goes in double quotes)."""
    return f'"{name}"' if "." in name else name
