"""packaging/kubernetes/*.yaml against the Kubernetes API schema, with no cluster and no network.

No Kubernetes server can run here (Debian 12 has none), so the manifests are checked against the
API's schema as Debian ships it: the model classes of python3-kubernetes (22.6.0 in Debian 12,
generated from Kubernetes' OpenAPI document release-1.22). Each model carries `openapi_types`
(field -> type: str, int, bool, list[T], dict(str, T), object, or another model) and
`attribute_map` (field -> its JSON name). The check is strict, recursively:

- a field the model does not have is an error (the API server's strict field validation);
- a value of the wrong type is an error (a bool is no int, a string is no int, a list of the wrong
  items is wrong; `object`, the schema's IntOrString and RawExtension, takes any value; a
  resource Quantity is a string here, where the API server would also take a number);
- a field the model requires (its constructor refuses None) and a null value are errors;
- apiVersion and kind must name a kind the API group serves (the package's `GroupVersionApi`
  class has `create_namespaced_KIND`), and the model is that method's body type;
- a YAML mapping with a key twice is an error (PyYAML would keep the last one silently).

Fields newer than release-1.22 are in NEWER_FIELDS: the only such field the manifests use is
hostUsers (Kubernetes 1.25). Each entry names its type in the schema's notation and is checked
with it; an entry the schema already knows is an error, so the list shrinks when Debian's package
catches up. Enumerated values are not in the 1.22 schema; the few the manifests depend on
(seccompProfile.type, procMount, the Secrets' type) are asserted by ManifestTest below.

ManifestTest checks what the schema cannot: that the DaemonSet, Service, Secrets and ConfigMaps
agree with each other and with docs/containers.md and docs/fleet.md. SchemaSelfTest shows the
checker fails: an unknown field, a wrong type, a missing required field, a key given twice, a
kind of another group, and a wrong type in a newer field are each rejected.

Run: python3 tests/packaging/kubernetes_manifests.py (ctest kubernetes_manifests, label packaging).
"""

import base64
import binascii
import copy
import json
import os
import re
import sys
import unittest
from pathlib import Path

# Debian's python3-kubernetes and python3-yaml are installed for Debian's interpreter; another
# python3 first on PATH (a pyenv) does not see them, so the test runs itself under Debian's.
DEBIAN_PYTHON = "/usr/bin/python3"
try:
    import yaml
    import kubernetes
    from kubernetes import client as k8s
    from kubernetes.utils.quantity import parse_quantity
except ImportError as error:
    if (os.path.exists(DEBIAN_PYTHON) and not os.environ.get("RLM_K8S_MANIFESTS_REEXEC")
            and os.path.realpath(sys.executable) != os.path.realpath(DEBIAN_PYTHON)):
        os.environ["RLM_K8S_MANIFESTS_REEXEC"] = "1"
        os.execv(DEBIAN_PYTHON, [DEBIAN_PYTHON, *sys.argv])
    sys.exit(f"kubernetes_manifests: {error}; install Debian's python3-kubernetes and "
             "python3-yaml (tools/setup)")

SOURCE = Path(__file__).resolve().parents[2]
MANIFESTS = SOURCE / "packaging" / "kubernetes"
FILES = ["rlm-sandbox-daemonset.yaml", "rlm-sandbox-service.yaml", "rlm-sandbox-secrets.yaml"]

# The schema's version, as the generated models say it ("The version of the OpenAPI document").
SCHEMA_VERSION = re.search(
    r"The version of the OpenAPI document: (\S+)",
    Path(sys.modules[k8s.V1PodSpec.__module__].__file__).read_text(encoding="utf-8")).group(1)
SCHEMA = f"python3-kubernetes {kubernetes.__version__} (OpenAPI document {SCHEMA_VERSION})"

# Fields the manifests use that are newer than SCHEMA: (model, JSON name) -> (type in the
# schema's notation, where it comes from). Keep it to what the manifests need, each entry with the
# upstream definition it copies.
NEWER_FIELDS = {
    # Kubernetes 1.25 added PodSpec.hostUsers (k8s.io/api core/v1 types.go:
    # `HostUsers *bool json:"hostUsers,omitempty"`, protobuf field 37), alpha behind the
    # UserNamespacesSupport feature gate. docs/containers.md: procMount: Unmasked is accepted only
    # with hostUsers: false.
    ("V1PodSpec", "hostUsers"): ("bool", "Kubernetes 1.25, core/v1 PodSpec.hostUsers *bool"),
}

PRIMITIVES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,),
              "datetime": (str,), "date": (str,)}


# ---- YAML: safe, and a key given twice is an error ----------------------------------------------
class StrictLoader(yaml.SafeLoader):
    pass


def _mapping_without_duplicates(loader, node, deep=False):
    loader.flatten_mapping(node)
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping", node.start_mark, f"the key {key!r} is given twice",
                key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                             _mapping_without_duplicates)


def load_documents(text):
    return [document for document in yaml.load_all(text, Loader=StrictLoader)
            if document is not None]


# ---- The schema walk -----------------------------------------------------------------------------
def kind_of(value):
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)


def body_model(api_version, kind):
    """The model a create of KIND in API_VERSION takes, as the package's API classes say, or a
    reason why there is none. The group to class rule is kubernetes.utils.create_from_yaml's."""
    group, _, version = api_version.partition("/")
    if not version:
        group, version = "core", group
    group = "".join(group.rsplit(".k8s.io", 1))
    api_name = ("".join(word.capitalize() for word in group.split(".")) + version.capitalize()
                + "Api")
    api = getattr(k8s, api_name, None)
    if api is None:
        return None, f"apiVersion {api_version!r}: no such API group/version in the schema"
    snake = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", kind))
    create = getattr(api, f"create_namespaced_{snake.lower()}", None)
    if create is None:
        return None, f"kind {kind!r} is not a namespaced kind of {api_version!r}"
    body = re.search(r":param (\w+) body:", create.__doc__ or "")
    return getattr(k8s, body.group(1)), None


class Walk:
    """One document's walk: `problems` lists each error with its JSON path."""

    def __init__(self):
        self.problems = []
        self.newer_fields_used = set()

    def fail(self, path, message):
        self.problems.append(f"{path or '(top)'}: {message}")

    def document(self, document):
        if not isinstance(document, dict):
            self.fail("", f"a manifest must be an object, not {kind_of(document)}")
            return
        api_version, kind = document.get("apiVersion"), document.get("kind")
        if not isinstance(api_version, str) or not isinstance(kind, str):
            self.fail("", "apiVersion and kind must be strings")
            return
        model, why = body_model(api_version, kind)
        if model is None:
            self.fail("", why)
            return
        self.value(model.__name__, document, "")

    def value(self, type_name, value, path):
        """VALUE checked as TYPE_NAME; returns it as the model classes take it."""
        if value is None:
            self.fail(path, f"is null ({type_name} expected)")
            return None
        if match := re.fullmatch(r"list\[(.+)\]", type_name):
            if not isinstance(value, list):
                self.fail(path, f"must be a list ({type_name}), not {kind_of(value)}")
                return None
            return [self.value(match.group(1), item, f"{path}[{i}]")
                    for i, item in enumerate(value)]
        if match := re.fullmatch(r"dict\(str, (.+)\)", type_name):
            if not isinstance(value, dict):
                self.fail(path, f"must be an object ({type_name}), not {kind_of(value)}")
                return None
            checked = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    self.fail(path, f"key {key!r} must be a string, not {kind_of(key)}")
                    continue
                checked[key] = self.value(match.group(1), item, f"{path}.{key}")
            return checked
        if type_name == "object":  # IntOrString, RawExtension, ...: the schema says no more
            return value
        if type_name in PRIMITIVES:
            numeric_bool = isinstance(value, bool) and type_name in ("int", "float")
            if not isinstance(value, PRIMITIVES[type_name]) or numeric_bool:
                self.fail(path, f"must be {type_name}, not {kind_of(value)} ({value!r})")
            return value
        model = getattr(k8s, type_name, None)
        if model is None or not hasattr(model, "openapi_types"):
            raise AssertionError(f"{path}: the schema names a type it does not define: {type_name}")
        return self.model(model, value, path)

    def model(self, model, value, path):
        if not isinstance(value, dict):
            self.fail(path, f"must be an object ({model.__name__}), not {kind_of(value)}")
            return None
        attribute_of = {json_name: attribute
                        for attribute, json_name in model.attribute_map.items()}
        problems_before = len(self.problems)
        arguments = {}
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if key in attribute_of:
                attribute = attribute_of[key]
                arguments[attribute] = self.value(model.openapi_types[attribute], item, where)
            elif (model.__name__, key) in NEWER_FIELDS:
                self.value(NEWER_FIELDS[(model.__name__, key)][0], item, where)
                self.newer_fields_used.add((model.__name__, key))
            else:
                self.fail(where, f"unknown field {key!r} ({model.__name__} has no such field "
                                 f"in {SCHEMA_VERSION})")
        if len(self.problems) > problems_before:
            return None
        try:  # the generated constructor refuses a required field left None
            return model(**arguments)
        except (ValueError, TypeError) as error:
            self.fail(path, f"{model.__name__}: {error}")
            return None


def schema_problems(documents):
    problems, newer = [], set()
    for document in documents:
        walk = Walk()
        walk.document(document)
        name = (document.get("metadata") or {}).get("name") if isinstance(document, dict) else None
        label = f"{document.get('kind') if isinstance(document, dict) else '?'}/{name}"
        problems += [f"{label}: {problem}" for problem in walk.problems]
        newer |= walk.newer_fields_used
    return problems, newer


def read_manifests():
    return {name: load_documents((MANIFESTS / name).read_text(encoding="utf-8")) for name in FILES}


# ---- The tests -----------------------------------------------------------------------------------
class SchemaTest(unittest.TestCase):
    """Every shipped manifest is valid under SCHEMA, NEWER_FIELDS aside."""

    @classmethod
    def setUpClass(cls):
        print(f"kubernetes_manifests: schema {SCHEMA}; newer fields checked from NEWER_FIELDS: "
              + ", ".join(f"{model}.{field} ({kind}: {source})"
                          for (model, field), (kind, source) in NEWER_FIELDS.items()),
              file=sys.stderr)
        cls.manifests = read_manifests()

    def test_every_manifest_is_valid(self):
        used = set()
        for name, documents in self.manifests.items():
            with self.subTest(file=name):
                self.assertTrue(documents, "no manifest in the file")
                problems, newer = schema_problems(documents)
                used |= newer
                if problems:
                    self.fail("\n".join(problems))
                print(f"  {name}: " + ", ".join(f"{d['apiVersion']} {d['kind']} "
                                                 f"{d['metadata']['name']}" for d in documents)
                      + " valid", file=sys.stderr)
        self.assertEqual(used, set(NEWER_FIELDS),
                         "NEWER_FIELDS has entries no manifest uses: remove them")

    def test_newer_fields_are_not_in_the_schema(self):
        for (model, field), (type_name, _) in NEWER_FIELDS.items():
            with self.subTest(field=f"{model}.{field}"):
                self.assertNotIn(field, getattr(k8s, model).attribute_map.values(),
                                 f"{SCHEMA} knows {model}.{field}: drop it from NEWER_FIELDS")
                self.assertTrue(type_name in PRIMITIVES or hasattr(k8s, type_name), type_name)


class SchemaSelfTest(unittest.TestCase):
    """The checker rejects what the API server would."""

    @classmethod
    def setUpClass(cls):
        cls.daemonset = read_manifests()["rlm-sandbox-daemonset.yaml"][0]

    def problems_after(self, change):
        document = copy.deepcopy(self.daemonset)
        change(document)
        return schema_problems([document])[0]

    def assertRejected(self, change, path, says):
        problems = self.problems_after(change)
        self.assertTrue(any(path in problem and says in problem for problem in problems),
                        f"expected a problem at {path} saying {says!r}; got {problems}")

    def test_the_unchanged_manifest_passes(self):
        self.assertEqual(self.problems_after(lambda d: None), [])

    def test_an_unknown_field_is_rejected(self):
        def misspell(d):  # procMount, misspelled, deep in the tree
            context = d["spec"]["template"]["spec"]["containers"][0]["securityContext"]
            context["procMont"] = "Unmasked"
        self.assertRejected(misspell, "spec.template.spec.containers[0].securityContext.procMont",
                            "unknown field 'procMont' (V1SecurityContext")
        self.assertRejected(lambda d: d.update(extra=1), "extra", "unknown field 'extra'")

    def test_a_wrong_type_is_rejected(self):
        def port_as_string(d):
            d["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "7443"
        self.assertRejected(port_as_string, "ports[0].containerPort", "must be int, not a string")

        def command_as_string(d):
            d["spec"]["template"]["spec"]["containers"][0]["command"] = "rlm-sandbox serve"
        self.assertRejected(command_as_string, "containers[0].command",
                            "must be a list (list[str])")

        def grace_as_bool(d):
            d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = True
        self.assertRejected(grace_as_bool, "terminationGracePeriodSeconds", "must be int")

        def container_as_list(d):
            d["spec"]["template"]["spec"]["containers"][0]["securityContext"] = []
        self.assertRejected(container_as_list, "securityContext", "must be an object")

    def test_a_wrong_type_in_a_newer_field_is_rejected(self):
        def host_users_as_string(d):
            d["spec"]["template"]["spec"]["hostUsers"] = "false"
        self.assertRejected(host_users_as_string, "spec.template.spec.hostUsers",
                            "must be bool, not a string")

    def test_a_missing_required_field_is_rejected(self):
        def no_name(d):
            del d["spec"]["template"]["spec"]["containers"][0]["name"]
        self.assertRejected(no_name, "spec.template.spec.containers[0]",
                            "`name`, must not be `None`")
        self.assertRejected(lambda d: d["spec"].pop("selector"), "spec",
                            "`selector`, must not be `None`")

    def test_a_null_is_rejected(self):
        self.assertRejected(lambda d: d["metadata"].update(labels=None), "metadata.labels",
                            "is null")

    def test_a_kind_of_another_group_is_rejected(self):
        self.assertRejected(lambda d: d.update(apiVersion="v1"), "(top)",
                            "kind 'DaemonSet' is not a namespaced kind of 'v1'")
        self.assertRejected(lambda d: d.update(apiVersion="apps/v9"), "(top)",
                            "no such API group/version")

    def test_a_key_given_twice_is_rejected(self):
        text = (MANIFESTS / "rlm-sandbox-service.yaml").read_text(encoding="utf-8")
        twice = text.replace("  clusterIP: None\n", "  clusterIP: None\n  clusterIP: 10.0.0.1\n")
        self.assertNotEqual(twice, text)
        with self.assertRaisesRegex(yaml.constructor.ConstructorError,
                                    "'clusterIP' is given twice"):
            load_documents(twice)


def parse_duration_seconds(text):
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    if not match:
        raise AssertionError(f"{text!r} is not a duration this test reads")
    return float(match.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[match.group(2)]


class ManifestTest(unittest.TestCase):
    """What the schema cannot see: the objects agree with each other and with the docs."""

    @classmethod
    def setUpClass(cls):
        manifests = read_manifests()
        cls.documents = [d for documents in manifests.values() for d in documents]
        cls.objects = {(d["kind"], d["metadata"]["name"]): d for d in cls.documents}
        cls.daemonset = cls.objects[("DaemonSet", "rlm-sandbox")]
        cls.pod = cls.daemonset["spec"]["template"]["spec"]
        (cls.container,) = cls.pod["containers"]
        cls.command = cls.container["command"]

    def server_json(self):
        return json.loads(
            self.objects[("ConfigMap", "rlm-sandbox-config")]["data"]["server.json"])

    def flag(self, name):
        index = self.command.index(name)
        return self.command[index + 1]

    def test_no_manifest_names_a_namespace(self):
        for document in self.documents:
            self.assertNotIn("namespace", document["metadata"], document["metadata"]["name"])

    def test_the_command_is_serve_on_the_tls_listener(self):
        self.assertEqual(self.command, [
            "rlm-sandbox", "serve", "--config", "/etc/rlm-sandbox/server.json",
            "--socket", "/run/rlm-sandbox/server.sock", "--node-id", "$(NODE_NAME)",
            "--listen", "0.0.0.0:7443", "--tls-cert", "/etc/rlm-sandbox/tls/tls.crt",
            "--tls-key", "/etc/rlm-sandbox/tls/tls.key",
            "--client-ca", "/etc/rlm-sandbox/tls/ca.crt",
            "--tls-identity-file", "/etc/rlm-sandbox/identities/identities.json"])
        self.assertEqual(self.container["image"], "rlm-sandbox:latest")
        (node_name,) = [e for e in self.container["env"] if e["name"] == "NODE_NAME"]
        self.assertEqual(node_name["valueFrom"], {"fieldRef": {"fieldPath": "spec.nodeName"}})
        (port,) = self.container["ports"]
        self.assertEqual((port["name"], port["containerPort"]), ("rlm-tls", 7443))
        self.assertEqual(self.flag("--listen").rpartition(":")[2], str(port["containerPort"]))

    def test_the_pod_is_confined_as_docs_containers_says(self):
        self.assertIs(self.pod["hostUsers"], False)
        self.assertEqual(self.pod["securityContext"]["seccompProfile"],
                         {"type": "Localhost", "localhostProfile": "rlm-sandbox-seccomp.json"})
        self.assertTrue((SOURCE / "packaging/containers/rlm-sandbox-seccomp.json").is_file())
        for flag in ("hostNetwork", "hostPID", "hostIPC"):
            self.assertFalse(self.pod.get(flag, False), flag)
        context = self.container["securityContext"]
        self.assertEqual(context["procMount"], "Unmasked")
        self.assertFalse(context.get("privileged", False))
        self.assertIs(context["allowPrivilegeEscalation"], False)
        self.assertEqual(context.get("capabilities", {}).get("add", []), [],
                         "docs/containers.md: no capability is added")
        self.assertNotIn("seccompProfile", context, "the pod's profile must not be overridden")

    def test_the_probes_ask_the_node_contract_on_the_served_socket(self):
        socket = self.flag("--socket")
        self.assertEqual(self.container["livenessProbe"]["exec"]["command"],
                         ["rlm-sandbox", "server", "health", "--server", socket])
        self.assertEqual(self.container["readinessProbe"]["exec"]["command"],
                         ["rlm-sandbox", "server", "ready", "--server", socket])

    def test_the_grace_outlasts_the_drain(self):
        config = self.server_json()
        drain = parse_duration_seconds(config.get("drain_grace", "30s"))  # serve's default: 30s
        self.assertGreater(self.pod["terminationGracePeriodSeconds"], drain)

    def mounted(self, path):
        """(volume, key inside it) holding PATH in the container."""
        best = None
        for mount in self.container["volumeMounts"]:
            root = mount["mountPath"].rstrip("/")
            if path == root or path.startswith(root + "/"):
                if best is None or len(root) > len(best["mountPath"].rstrip("/")):
                    best = mount
        self.assertIsNotNone(best, f"{path} is on no volume")
        (volume,) = [v for v in self.pod["volumes"] if v["name"] == best["name"]]
        rest = path[len(best["mountPath"].rstrip("/")):].lstrip("/")
        key = best.get("subPath", "") + ("/" + rest if best.get("subPath") and rest else rest)
        return best, volume, key

    def test_every_file_the_command_names_is_mounted_from_a_shipped_object(self):
        for flag in ("--config", "--tls-cert", "--tls-key", "--client-ca", "--tls-identity-file"):
            with self.subTest(flag=flag):
                mount, volume, key = self.mounted(self.flag(flag))
                self.assertTrue(mount.get("readOnly"), f"{mount['name']} must be read-only")
                if "secret" in volume:
                    source = self.objects[("Secret", volume["secret"]["secretName"])]
                else:
                    source = self.objects[("ConfigMap", volume["configMap"]["name"])]
                self.assertIn(key, source["data"], f"{flag}: {key} is not in {volume['name']}")
        mount, volume, key = self.mounted(self.flag("--socket"))
        self.assertIn("emptyDir", volume)
        self.assertEqual(key, "server.sock")
        names = {v["name"] for v in self.pod["volumes"]}
        for mount in self.container["volumeMounts"]:
            self.assertIn(mount["name"], names)

    def test_the_tls_secrets(self):
        for name in ("rlm-sandbox-tls", "rlm-sandbox-client-tls"):
            with self.subTest(secret=name):
                secret = self.objects[("Secret", name)]
                self.assertEqual(secret["type"], "kubernetes.io/tls")
                self.assertEqual(set(secret["data"]), {"tls.crt", "tls.key", "ca.crt"})
                for key, value in secret["data"].items():
                    try:  # the API server takes data as base64
                        base64.b64decode(value, validate=True)
                    except binascii.Error as error:
                        self.fail(f"{name}.data.{key} is not base64: {error}")

    def test_the_configuration_is_one_serve_reads(self):
        config = self.server_json()
        source = (SOURCE / "runtime/server/config.cpp").read_text(encoding="utf-8")
        keys = re.search(r'only_keys\(document, "",\s*\{([^}]*)\}', source)
        self.assertIsNotNone(keys, "runtime/server/config.cpp: the top-level keys were not found")
        self.assertLessEqual(set(config), set(re.findall(r'"(\w+)"', keys.group(1))))
        identities = json.loads(
            self.objects[("ConfigMap", "rlm-sandbox-identities")]["data"]["identities.json"])
        self.assertEqual(list(identities), ["identities"])
        self.assertTrue(identities["identities"])
        for identity, uid in identities["identities"].items():
            self.assertIsInstance(identity, str)
            self.assertTrue(isinstance(uid, int) and not isinstance(uid, bool) and uid >= 0, uid)
            self.assertIn(uid, config["allow"]["uids"], f"{identity}'s uid is not allowed")

    def test_the_service_finds_ready_nodes_only(self):
        service = self.objects[("Service", "rlm-sandbox")]["spec"]
        labels = self.daemonset["spec"]["template"]["metadata"]["labels"]
        self.assertEqual(labels.get("app.kubernetes.io/name"), "rlm-sandbox")
        self.assertEqual(self.daemonset["spec"]["selector"], {"matchLabels": labels})
        self.assertEqual(service["clusterIP"], "None")
        self.assertIs(service["publishNotReadyAddresses"], False)
        self.assertLessEqual(service["selector"].items(), labels.items())
        (port,) = service["ports"]
        self.assertEqual((port["name"], port["port"], port["targetPort"]),
                         ("rlm-tls", 7443, "rlm-tls"))

    def test_resources_are_requested_in_valid_quantities(self):
        requests = self.container["resources"]["requests"]
        self.assertEqual(set(requests), {"cpu", "memory"})
        for quantity in requests.values():
            self.assertGreater(parse_quantity(quantity), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
