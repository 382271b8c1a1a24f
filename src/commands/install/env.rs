//! Which of the installer's environment variables an MCP client entry carries to the server.
//!
//! MCP clients start servers with a minimal environment (often only `PATH`, `HOME`, `USER`).
//! The server itself needs nothing more, but the `uv` it runs for `env_install` and
//! `python_run_script` does: behind an intercepting proxy it needs the proxy and the
//! proxy's CA certificate, and a private index needs its URL. So `install` copies the
//! variables below into the entry when they are set at install time. The server forwards
//! exactly these (plus other `UV_*` settings) to uv; see `src/envs/uv.rs`.
//!
//! Values that carry credentials (`scheme://user:pass@host`) are never copied: client
//! configuration files are often shared or committed (`.vscode/mcp.json`). `install`
//! names the ones it left out so the user can add them by hand.

/// The variables copied when set, in the order they are written.
pub(crate) const PASS_THROUGH: &[&str] = &[
    // TLS trust: the CA bundle of an intercepting proxy.
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    // Proxies, both spellings (curl's convention; uv reads both).
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
    "NO_PROXY",
    "no_proxy",
    // Where packages come from.
    "UV_INDEX_URL",
    "UV_DEFAULT_INDEX",
    "UV_EXTRA_INDEX_URL",
    "UV_INDEX",
    "UV_FIND_LINKS",
    "UV_NATIVE_TLS",
    "UV_OFFLINE",
];

/// What to pass through: `(name, value)` pairs, and the names left out because their
/// value holds credentials.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct PassThrough {
    pub vars: Vec<(String, String)>,
    pub withheld: Vec<&'static str>,
}

/// The [`PASS_THROUGH`] variables `lookup` finds set (non-empty).
pub(crate) fn pass_through(lookup: impl Fn(&str) -> Option<String>) -> PassThrough {
    let mut out = PassThrough::default();
    for &name in PASS_THROUGH {
        let Some(value) = lookup(name).filter(|v| !v.is_empty()) else {
            continue;
        };
        if has_credentials(&value) {
            out.withheld.push(name);
        } else {
            out.vars.push((name.to_string(), value));
        }
    }
    out
}

/// Whether any URL in `value` has a user-info part (`scheme://user[:pass]@host`).
fn has_credentials(value: &str) -> bool {
    value.match_indices("://").any(|(at, sep)| {
        let rest = &value[at + sep.len()..];
        let authority_end = rest.find(['/', ',', ' ', '?', '#']).unwrap_or(rest.len());
        rest[..authority_end].contains('@')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn copies_set_variables_in_list_order_and_skips_empty_and_unknown() {
        let got = pass_through(env(&[
            ("no_proxy", "localhost"),
            ("SSL_CERT_FILE", "/etc/ssl/corp.pem"),
            ("HTTPS_PROXY", ""),
            ("AWS_SECRET_ACCESS_KEY", "x"),
            ("UV_INDEX_URL", "https://pypi.corp/simple"),
        ]));
        assert_eq!(
            got.vars,
            vec![
                ("SSL_CERT_FILE".into(), "/etc/ssl/corp.pem".into()),
                ("no_proxy".into(), "localhost".into()),
                ("UV_INDEX_URL".into(), "https://pypi.corp/simple".into()),
            ]
        );
        assert!(got.withheld.is_empty());
    }

    #[test]
    fn withholds_urls_with_credentials() {
        let got = pass_through(env(&[
            ("HTTPS_PROXY", "http://alice:s3cret@proxy:3128"),
            ("HTTP_PROXY", "http://proxy:3128"),
            ("UV_INDEX", "corp=https://tok@pypi.corp/simple"),
            ("NO_PROXY", "user@example.com"),
        ]));
        assert_eq!(
            got.vars,
            vec![
                ("HTTP_PROXY".into(), "http://proxy:3128".into()),
                ("NO_PROXY".into(), "user@example.com".into()),
            ]
        );
        assert_eq!(got.withheld, vec!["HTTPS_PROXY", "UV_INDEX"]);
    }

    #[test]
    fn credentials_detection_looks_only_at_the_authority() {
        assert!(!has_credentials("https://pypi.org/simple/@scope/pkg"));
        assert!(!has_credentials("/etc/ssl/certs"));
        assert!(has_credentials(
            "a=https://x.org,b=https://u:p@y.org/simple"
        ));
    }
}
