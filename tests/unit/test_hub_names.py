"""Tests of gpufleet.hub_names: endpoints, credentials kept out of URLs, repo ids."""
import pytest

from gpufleet import hub_errors, hub_names


@pytest.mark.parametrize("bad", ["", "ftp://x", "huggingface.co", "http://"])
def test_bad_endpoint_is_refused(bad):
    with pytest.raises(hub_errors.HubError, match="not an http"):
        hub_names.normalize_endpoint(bad)


def test_redact_url_drops_credentials():
    assert hub_names.redact_url("https://u:secret@m.example:8443/x") == "https://m.example:8443/x"


@pytest.mark.parametrize("repo_id", ["noslash/", "a/b/c", "../x", "a b/c", ""])
def test_bad_repo_id(repo_id):
    with pytest.raises(hub_errors.HubError, match="repo_id"):
        hub_names.validate_repo_id(repo_id)
