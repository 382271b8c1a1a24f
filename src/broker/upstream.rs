//! What stays with the server: its own proxy settings (`HTTPS_PROXY`, `HTTP_PROXY`,
//! `ALL_PROXY`, `NO_PROXY`, credentials included) and package-index credentials
//! (`UV_INDEX_URL=https://user:pass@...`, `UV_INDEX_<NAME>_USERNAME/PASSWORD`, ...).
//! The broker chains to the upstream proxy itself and adds an index's `Authorization`
//! header to the installer's own plain-HTTP reads of that index (see `conn`); jobs never
//! see either.

use std::sync::Arc;

use base64::Engine;
use hyper_util::client::proxy::matcher::{Intercept, Matcher};

use crate::sandbox::policy::allow::normalize;

/// An upstream proxy: where to connect and the `Proxy-Authorization` value, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyTarget {
    pub host: String,
    pub port: u16,
    pub authorization: Option<String>,
}

/// The server's upstream settings, read once at start.
#[derive(Debug, Clone, Default)]
pub struct Upstream {
    /// Which connections go through which proxy: hyper-util's matcher, built from
    /// `HTTP_PROXY` (plain HTTP), `HTTPS_PROXY` (CONNECT tunnels), `ALL_PROXY` (either,
    /// when the specific one is unset) and `NO_PROXY` (curl's rules: domains and their
    /// subdomains, IP addresses, CIDR ranges, `*`). `None`: no proxy is set.
    proxies: Option<Arc<Matcher>>,
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
pub(crate) const INDEX_VARS: &[&str] = &[
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

/// The proxy a matcher chose, if we can speak to it: only plain-HTTP proxies (the broker
/// sends CONNECT or an absolute-form request in the clear; no TLS or SOCKS to the proxy).
fn proxy_target(i: &Intercept) -> Option<ProxyTarget> {
    let uri = i.uri();
    if uri.scheme_str() != Some("http") {
        return None;
    }
    Some(ProxyTarget {
        host: normalize(uri.host()?.trim_start_matches('[').trim_end_matches(']')),
        // curl's default is 1080; a proxy URL without a port is rare and 3128 (squid's)
        // is what the earlier versions of this server assumed.
        port: uri.port_u16().unwrap_or(3128),
        authorization: i
            .basic_auth()
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
    })
}

/// One index URL (`http(s)://[user[:password]@]host[:port]/path`), parsed by the `url`
/// crate: host (normalized, IPv6 without brackets), port in effect, path, and the
/// percent-decoded user and password if present.
struct IndexUrl {
    host: String,
    port: u16,
    path: String,
    user: Option<(String, String)>,
}

fn index_url(raw: &str) -> Option<IndexUrl> {
    let u = url::Url::parse(raw.trim()).ok()?;
    if !matches!(u.scheme(), "http" | "https") {
        return None;
    }
    let host = match u.host()? {
        url::Host::Domain(d) => normalize(d),
        url::Host::Ipv4(a) => a.to_string(),
        url::Host::Ipv6(a) => a.to_string(),
    };
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let user = (!u.username().is_empty())
        .then(|| (decode(u.username()), decode(u.password().unwrap_or(""))));
    Some(IndexUrl {
        host,
        port: u.port_or_known_default()?,
        path: u.path().trim_end_matches('/').to_string(),
        user,
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
        let (http, https, all) = (
            get(&["HTTP_PROXY", "http_proxy"]).unwrap_or_default(),
            get(&["HTTPS_PROXY", "https_proxy"]).unwrap_or_default(),
            get(&["ALL_PROXY", "all_proxy"]).unwrap_or_default(),
        );
        let proxies = [&http, &https, &all]
            .iter()
            .any(|v| !v.is_empty())
            .then(|| {
                let builder = || {
                    Matcher::builder()
                        .http(&http)
                        .https(&https)
                        .all(&all)
                };
                // What each kind of connection would use, NO_PROXY aside: said once if
                // the broker cannot speak to it (an https:// or socks proxy).
                let probe = builder().build();
                for dst in ["http://probe.invalid/", "https://probe.invalid/"] {
                    if let Some(i) = probe.intercept(&hyper::Uri::from_static(dst))
                        && proxy_target(&i).is_none()
                    {
                        tracing::warn!(
                            "upstream proxy {} for {dst} ignored: only http:// proxies are supported",
                            i.uri()
                        );
                    }
                }
                let no = get(&["NO_PROXY", "no_proxy"]).unwrap_or_default();
                Arc::new(builder().no(no).build())
            });
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
                let Some(u) = index_url(url) else {
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
                let inline = u.user.as_ref().map(|(user, pass)| basic(user, pass));
                if let Some(authorization) = named.or(inline) {
                    index_auth.push(IndexAuth {
                        host: u.host,
                        port: u.port,
                        path: u.path,
                        authorization,
                    });
                }
            }
        }
        Upstream {
            proxies,
            index_auth,
        }
    }

    /// The upstream proxy for a connection to `host` (normalized; IPv6 without brackets)
    /// — a CONNECT tunnel when `tunnel` — unless `NO_PROXY` exempts the host.
    pub fn proxy_for(&self, host: &str, tunnel: bool) -> Option<ProxyTarget> {
        let matcher = self.proxies.as_ref()?;
        let scheme = if tunnel { "https" } else { "http" };
        let authority = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_string()
        };
        let dst: hyper::Uri = format!("{scheme}://{authority}/").parse().ok()?;
        proxy_target(&matcher.intercept(&dst)?)
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

    /// What the matcher brings (curl's NO_PROXY rules): CIDR ranges, IP addresses (IPv6
    /// too), `*`, case-insensitive domains; ALL_PROXY as the fallback; an https:// or
    /// socks proxy is not used (the broker speaks plain HTTP to its proxy).
    #[test]
    fn no_proxy_and_fallbacks_follow_curl() {
        let u = up(&[
            ("ALL_PROXY", "http://all.corp:9000"),
            ("HTTP_PROXY", "  "),
            ("http_proxy", "http://plain.corp:8000"),
            ("no_proxy", "10.0.0.0/8, ::1, Corp.Example ,192.168.1.7"),
        ]);
        assert_eq!(u.proxy_for("pypi.org", false).unwrap().host, "plain.corp");
        let all = u.proxy_for("pypi.org", true).unwrap();
        assert_eq!(
            (all.host.as_str(), all.port, all.authorization),
            ("all.corp", 9000, None)
        );
        for exempt in [
            "10.1.2.3",
            "::1",
            "corp.example",
            "a.b.CORP.example",
            "192.168.1.7",
        ] {
            assert!(u.proxy_for(exempt, true).is_none(), "{exempt}");
        }
        for through in ["11.0.0.1", "::2", "notcorp.example", "192.168.1.8"] {
            assert!(u.proxy_for(through, true).is_some(), "{through}");
        }
        assert!(
            up(&[("ALL_PROXY", "http://p:1"), ("NO_PROXY", "*")])
                .proxy_for("pypi.org", true)
                .is_none()
        );
        // A proxy named by its IPv6 address.
        let v6 = up(&[("HTTPS_PROXY", "http://[fd00::5]:3129")]);
        assert_eq!(v6.proxy_for("pypi.org", true).unwrap().host, "fd00::5");
        assert!(v6.proxy_for("pypi.org", false).is_none());
        for unusable in [
            "https://tls.corp:443",
            "socks5h://s.corp:1080",
            "ftp://f.corp",
        ] {
            assert!(
                up(&[("ALL_PROXY", unusable)])
                    .proxy_for("pypi.org", true)
                    .is_none(),
                "{unusable}"
            );
        }
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
        // What the url crate brings: IPv6 hosts, percent-decoded credentials, case and
        // dot segments normalized, default ports.
        let u = up(&[(
            "PIP_EXTRA_INDEX_URL",
            "http://a%3Ab:p%40ss@[FD00::1]/x/../simple/ HTTPS://u:@Pkgs.Example.:8443/s",
        )]);
        let at = |h: &str, p: u16| {
            u.indexes_at(h, p)
                .map(|i| (i.path.clone(), i.authorization.clone()))
                .collect::<Vec<_>>()
        };
        // base64("a:b:p@ss")
        assert_eq!(
            at("fd00::1", 80),
            [("/simple".to_string(), "Basic YTpiOnBAc3M=".to_string())]
        );
        assert_eq!(
            at("pkgs.example", 8443),
            [("/s".to_string(), "Basic dTo=".to_string())]
        );
        assert!(
            up(&[("UV_INDEX_URL", "file:///wheels")])
                .index_auth
                .is_empty()
        );
        assert!(
            up(&[("UV_INDEX_URL", "http://u:p@/nohost")])
                .index_auth
                .is_empty()
        );
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
