//! What stays with the server: its own proxy settings (`HTTPS_PROXY`, `HTTP_PROXY`,
//! `ALL_PROXY`, `NO_PROXY`, credentials included) and package-index credentials
//! (`UV_INDEX_URL=https://user:pass@...`, `UV_INDEX_<NAME>_USERNAME/PASSWORD`, ...).
//! The broker chains to the upstream proxy itself and adds an index's `Authorization`
//! header to the installer's own plain-HTTP reads of that index (see `conn`); jobs never
//! see either.

use base64::Engine;

use crate::sandbox::policy::allow::UrlParts;

/// An upstream proxy: where to connect and the `Proxy-Authorization` value, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyTarget {
    pub host: String,
    pub port: u16,
    pub authorization: Option<String>,
}

/// The server's upstream settings, read once at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Upstream {
    /// For plain HTTP (`HTTP_PROXY`, else `ALL_PROXY`).
    pub http: Option<ProxyTarget>,
    /// For CONNECT tunnels (`HTTPS_PROXY`, else `ALL_PROXY`).
    pub https: Option<ProxyTarget>,
    /// `NO_PROXY` entries (lowercase, leading dot removed; `*` = everything).
    pub no_proxy: Vec<String>,
    /// Package indexes with credentials.
    pub index_auth: Vec<IndexAuth>,
}

/// One package index (or find-links page) with credentials: where, and the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexAuth {
    pub host: String,
    pub port: u16,
    /// The index URL's path without a trailing `/` (empty: the whole host).
    pub path: String,
    /// The `Authorization` value.
    pub authorization: String,
}

impl IndexAuth {
    /// Whether a request for `path` (origin form, query allowed) lies under this index's
    /// path: segment-wise, with no dot segment and no encoded dot, slash or backslash
    /// that a server might decode into a way out of it.
    pub fn covers(&self, path: &str) -> bool {
        let path = path.split(['?', '#']).next().unwrap_or_default();
        let lower = path.to_ascii_lowercase();
        if ["%2e", "%2f", "%5c", "\\"]
            .iter()
            .any(|bad| lower.contains(bad))
            || path.split('/').any(|seg| seg == "." || seg == "..")
        {
            return false;
        }
        match path.strip_prefix(self.path.as_str()) {
            Some(rest) => rest.is_empty() || rest.starts_with('/'),
            None => false,
        }
    }

    /// `http://host[:port]/path/` for messages.
    pub fn url(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let port = if self.port == 80 {
            String::new()
        } else {
            format!(":{}", self.port)
        };
        format!("http://{host}{port}{}/", self.path)
    }
}

/// Variables naming package indexes (space- or comma-separated URLs, maybe `name=url`).
pub const INDEX_VARS: &[&str] = &[
    "UV_INDEX_URL",
    "UV_DEFAULT_INDEX",
    "UV_EXTRA_INDEX_URL",
    "UV_INDEX",
    "UV_FIND_LINKS",
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_FIND_LINKS",
];

fn basic(user: &str, password: &str) -> String {
    let raw = format!("{user}:{password}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(raw)
    )
}

fn proxy_target(url: &str) -> Option<ProxyTarget> {
    // A proxy URL may omit the scheme ("proxy:3128").
    let with_scheme = if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    };
    let u = UrlParts::parse(&with_scheme)?;
    if u.scheme != "http" {
        tracing::warn!(
            "upstream proxy {} ignored: only http:// proxies are supported",
            u.allow_entry()
        );
        return None;
    }
    Some(ProxyTarget {
        host: u.host.clone(),
        port: u.port.unwrap_or(3128),
        authorization: u
            .user
            .as_deref()
            .map(|user| basic(user, u.password.as_deref().unwrap_or(""))),
    })
}

/// The name in `UV_INDEX_<NAME>_USERNAME` for an index named `name`.
fn env_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

impl Upstream {
    /// Read the settings from `vars` (the server's environment).
    pub fn from_env(vars: impl Iterator<Item = (String, String)>) -> Upstream {
        let vars: Vec<(String, String)> = vars.collect();
        let get = |names: &[&str]| {
            names.iter().find_map(|n| {
                vars.iter()
                    .find(|(k, v)| k == n && !v.trim().is_empty())
                    .map(|(_, v)| v.clone())
            })
        };
        let http = get(&["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"])
            .and_then(|u| proxy_target(&u));
        let https = get(&["HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"])
            .and_then(|u| proxy_target(&u));
        let no_proxy = get(&["NO_PROXY", "no_proxy"])
            .unwrap_or_default()
            .split(',')
            .map(|s| s.trim().trim_start_matches('.').to_ascii_lowercase())
            .filter(|s| !s.is_empty())
            .collect();
        let mut index_auth = Vec::new();
        for var in INDEX_VARS {
            let Some(value) = vars.iter().find(|(k, _)| k == var).map(|(_, v)| v) else {
                continue;
            };
            for token in value.split([' ', ',', '\n']).filter(|t| !t.is_empty()) {
                let (name, url) = match token.split_once('=') {
                    Some((n, u)) if !n.contains("://") => (Some(n), u),
                    _ => (None, token),
                };
                let Some(u) = UrlParts::parse(url) else {
                    continue;
                };
                let named = name.and_then(|n| {
                    let key = env_name(n);
                    let user = vars
                        .iter()
                        .find(|(k, _)| *k == format!("UV_INDEX_{key}_USERNAME"))?;
                    let pass = vars
                        .iter()
                        .find(|(k, _)| *k == format!("UV_INDEX_{key}_PASSWORD"))
                        .map(|(_, v)| v.as_str())
                        .unwrap_or("");
                    Some(basic(&user.1, pass))
                });
                let inline = u
                    .user
                    .as_deref()
                    .map(|user| basic(user, u.password.as_deref().unwrap_or("")));
                if let Some(authorization) = named.or(inline) {
                    let path = u.rest.split(['?', '#']).next().unwrap_or_default();
                    index_auth.push(IndexAuth {
                        host: u.host.clone(),
                        port: u.port_or_default(),
                        path: path.trim_end_matches('/').to_string(),
                        authorization,
                    });
                }
            }
        }
        Upstream {
            http,
            https,
            no_proxy,
            index_auth,
        }
    }

    /// The upstream proxy for a connection to `host` (a tunnel when `tunnel`), unless
    /// `NO_PROXY` exempts the host.
    pub fn proxy_for(&self, host: &str, tunnel: bool) -> Option<&ProxyTarget> {
        let exempt = self.no_proxy.iter().any(|n| {
            n == "*"
                || host == n
                || host
                    .strip_suffix(n.as_str())
                    .is_some_and(|h| h.ends_with('.'))
        });
        if exempt {
            return None;
        }
        if tunnel {
            self.https.as_ref()
        } else {
            self.http.as_ref()
        }
    }

    /// The package indexes with credentials at `host:port`.
    pub fn indexes_at<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> impl Iterator<Item = &'a IndexAuth> + 'a {
        self.index_auth
            .iter()
            .filter(move |i| i.host == host && i.port == port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(vars: &[(&str, &str)]) -> Upstream {
        Upstream::from_env(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    #[test]
    fn proxies_and_credentials_are_read() {
        let u = up(&[
            ("HTTPS_PROXY", "http://bob:s%40cret@proxy.corp:8080"),
            ("http_proxy", "proxy.corp:3128"),
            ("NO_PROXY", "localhost,.internal.example"),
        ]);
        let t = u.proxy_for("pypi.org", true).unwrap();
        assert_eq!((t.host.as_str(), t.port), ("proxy.corp", 8080));
        // base64("bob:s@cret")
        assert_eq!(t.authorization.as_deref(), Some("Basic Ym9iOnNAY3JldA=="));
        assert_eq!(u.proxy_for("pypi.org", false).unwrap().port, 3128);
        assert!(u.proxy_for("a.internal.example", true).is_none());
        assert!(u.proxy_for("localhost", true).is_none());
        assert!(up(&[]).proxy_for("pypi.org", true).is_none());
    }

    #[test]
    fn index_credentials_inline_and_named() {
        let u = up(&[
            ("UV_INDEX_URL", "http://alice:pw@127.0.0.1:8123/simple"),
            (
                "UV_INDEX",
                "corp=https://pkgs.corp/simple other=https://x.org",
            ),
            ("UV_INDEX_CORP_USERNAME", "svc"),
            ("UV_INDEX_CORP_PASSWORD", "tok"),
        ]);
        let at = |h: &str, p: u16| {
            u.indexes_at(h, p)
                .map(|i| (i.path.clone(), i.authorization.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            at("127.0.0.1", 8123),
            [("/simple".to_string(), "Basic YWxpY2U6cHc=".to_string())]
        );
        assert_eq!(
            at("pkgs.corp", 443),
            [("/simple".to_string(), "Basic c3ZjOnRvaw==".to_string())]
        );
        assert!(at("x.org", 443).is_empty());
    }

    #[test]
    fn an_index_covers_its_own_path_only() {
        let idx = |path: &str| IndexAuth {
            host: "h".into(),
            port: 80,
            path: path.into(),
            authorization: String::new(),
        };
        let simple = idx("/simple");
        for ok in [
            "/simple",
            "/simple/",
            "/simple/pkg/",
            "/simple/pkg/pkg-1.0.tar.gz#sha256=00",
            "/simple/pkg/?format=json",
        ] {
            assert!(simple.covers(ok), "{ok}");
        }
        for bad in [
            "/",
            "/simplex/",
            "/upload",
            "/simple/../upload",
            "/simple/./x",
            "/simple/%2e%2e/upload",
            "/simple/%2E%2e/upload",
            "/simple/..%2fupload",
            "/simple/..%2Fupload",
            "/simple/..%5cupload",
            "/simple/..\\upload",
            "?/simple/",
        ] {
            assert!(!simple.covers(bad), "{bad}");
        }
        // A whole-host index (no path) still refuses dot segments.
        assert!(idx("").covers("/anything/x"));
        assert!(!idx("").covers("/a/../b"));
        assert_eq!(simple.url(), "http://h/simple/");
    }
}
