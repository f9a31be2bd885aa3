"""roles/fleet_ca, entry point certificate (issue #32 item 2): the one place gpufleet makes a
certificate. Run alone on localhost through ansible-playbook: the CA and a host certificate
made on the control node, installed with the modes asked for, idempotent, signed again in
its last days or when its names change, and an operator's mismatched pair refused before
anything reaches the host. The gateway's use of it: tests/unit/test_gateway_tls.py and
molecule/vllm_gateway."""
import pathlib

from cryptography import x509

from gpufleet import tls

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(tmp_path, extra, check=False):
    from helpers import run_playbook

    play = tmp_path / "play.yml"
    play.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                    "    - name: Certificate\n      ansible.builtin.include_role:\n"
                    "        name: gpufleet.fleet.fleet_ca\n        tasks_from: certificate\n"
                    "    - name: Show the result\n      ansible.builtin.debug:\n"
                    "        var: fleet_ca_certificate\n")
    inventory = tmp_path / "hosts"
    inventory.write_text(f"localhost ansible_connection=local ansible_python_interpreter={ROOT / '.venv/bin/python'}\n")
    (tmp_path / "host").mkdir(exist_ok=True)
    base = {"fleet_ca_dir": str(tmp_path / "ca"), "fleet_ca_cert_name": "gpu-a-vllm",
            "fleet_ca_cert_names": ["gpu-a", "10.0.0.7", "localhost"],
            "fleet_ca_cert_dest": str(tmp_path / "host/cert.pem"),
            "fleet_ca_key_dest": str(tmp_path / "host/key.pem"),
            "fleet_ca_ca_dest": str(tmp_path / "host/ca.crt")}
    rc, _, failures, changed, output = run_playbook(inventory, play, "localhost", dict(base, **extra),
                                                    check=check, verbosity=2, with_output=True)
    return rc, failures, changed, output


def _leaf(tmp_path):
    return x509.load_pem_x509_certificate((tmp_path / "host/cert.pem").read_bytes())


def test_a_certificate_is_issued_installed_kept_and_renewed_in_its_last_days(tmp_path):
    rc, failures, changed, output = _run(tmp_path, {"fleet_ca_cert_days": 40})
    assert rc == 0, failures
    host = tmp_path / "host"
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in host.iterdir()}
    assert modes == {"cert.pem": "0o644", "key.pem": "0o600", "ca.crt": "0o644"}
    assert oct((tmp_path / "ca").stat().st_mode & 0o777) == "0o700"
    assert tls.pair_problems((host / "cert.pem").read_text(), (host / "key.pem").read_text()) == []
    leaf = _leaf(tmp_path)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["gpu-a", "localhost"]
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]
    assert leaf.issuer.rfc4514_string() == "CN=gpufleet fleet CA"
    key_body = "".join((host / "key.pem").read_text().splitlines()[1:-1])
    assert key_body[:40] not in output
    serial = leaf.serial_number
    # again: nothing changes (40 days left, renewal from 30)
    rc, failures, changed, _ = _run(tmp_path, {"fleet_ca_cert_days": 40})
    assert rc == 0 and changed == [] and _leaf(tmp_path).serial_number == serial, (failures, changed)
    # in its last 45 days: signed again, and the host gets it
    rc, failures, changed, _ = _run(tmp_path, {"fleet_ca_cert_renew_days": 45})
    assert rc == 0 and "gpufleet.fleet.fleet_ca : Fleet CA | Sign this certificate (again in its last days)" in changed, (failures, changed)
    assert _leaf(tmp_path).serial_number != serial and "gpufleet.fleet.fleet_ca : Fleet CA | Write the certificate" in changed
    serial = _leaf(tmp_path).serial_number
    # a new name: signed again at once
    rc, failures, changed, _ = _run(tmp_path, {"fleet_ca_cert_names": ["gpu-a", "gpu-a.example.org"]})
    assert rc == 0 and _leaf(tmp_path).serial_number != serial, failures
    san = _leaf(tmp_path).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["gpu-a", "gpu-a.example.org"]


def test_an_operators_mismatched_pair_is_refused_before_the_host_changes(tmp_path):
    from test_gateway_tls import _pair

    cert, _ = _pair(days_after=3650)
    _, other = _pair()
    (tmp_path / "op.crt").write_text(cert)
    (tmp_path / "other.key").write_text(other)
    rc, failures, changed, output = _run(tmp_path, {"fleet_ca_cert_src": str(tmp_path / "op.crt"),
                                                    "fleet_ca_key_src": str(tmp_path / "other.key")})
    assert rc != 0 and changed == [] and len(failures) == 1, failures
    assert f"{tmp_path}/other.key is not the private key of {tmp_path}/op.crt" in failures[0]
    assert "Nothing was changed" in failures[0] and other.splitlines()[1] not in output
    assert list((tmp_path / "host").iterdir()) == [] and not (tmp_path / "ca").exists()
