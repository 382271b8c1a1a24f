//! The allow-list grammar of `network.mode = "proxy"`: each entry is a host or
//! `host:port`, where the host is a DNS name, `*.` + a DNS name (any subdomain), an IPv4
//! literal or a bracketed IPv6 literal. Parsed strictly at policy load; the broker asks
//! [`AllowEntry::matches`] for every connection.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Ports an entry without `:port` allows: HTTPS and plain HTTP.
pub(crate) const DEFAULT_PORTS: &[u16] = &[443, 80];

/// Why an allow entry is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AllowError {
    #[error(
        "{entry:?} is not a host or host:port; write e.g. \"pypi.org\", \"*.example.com:443\", \"127.0.0.1:8000\" or \"[::1]:8000\""
    )]
    NotAHost { entry: String },
    #[error(
        "{entry:?} has a wildcard in the wrong place; `*.` may only start an entry, followed by a domain with a dot (\"*.example.com\")"
    )]
    Wildcard { entry: String },
    #[error("{entry:?} has port {port:?}; give a port in 1..=65535")]
    Port { entry: String, port: String },
}

/// The host part of an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HostPattern {
    /// Exactly this name (lowercase, no trailing dot).
    Name(String),
    /// Any name ending in `.suffix` (not `suffix` itself).
    Subdomains(String),
    /// This address literal.
    Ip(IpAddr),
}

/// One parsed allow-list entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AllowEntry {
    pub host: HostPattern,
    /// `None`: [`DEFAULT_PORTS`].
    pub port: Option<u16>,
}

impl AllowEntry {
    /// Parse one entry of `allow`.
    pub(crate) fn parse(entry: &str) -> Result<AllowEntry, AllowError> {
        let not_a_host = || AllowError::NotAHost {
            entry: entry.to_string(),
        };
        let text = entry.trim();
        if text.is_empty() || text.contains("://") || text.contains('/') || text.contains('@') {
            return Err(not_a_host());
        }
        let (host, port) = split_host_port(text).ok_or_else(not_a_host)?;
        let port =
            match port {
                None => None,
                Some(p) => Some(p.parse::<u16>().ok().filter(|&n| n != 0).ok_or_else(|| {
                    AllowError::Port {
                        entry: entry.to_string(),
                        port: p.to_string(),
                    }
                })?),
            };
        let host = parse_host(host, entry)?;
        Ok(AllowEntry { host, port })
    }

    /// Whether a connection to `host:port` is allowed by this entry. `host` is what the
    /// client asked for (a name or an address literal, IPv6 without brackets).
    pub(crate) fn matches(&self, host: &str, port: u16) -> bool {
        let port_ok = match self.port {
            Some(p) => p == port,
            None => DEFAULT_PORTS.contains(&port),
        };
        if !port_ok {
            return false;
        }
        let host = normalize(host);
        match &self.host {
            HostPattern::Name(n) => *n == host,
            HostPattern::Subdomains(s) => host
                .strip_suffix(s.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            HostPattern::Ip(ip) => host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
                .is_ok_and(|h| h == *ip),
        }
    }

    /// Whether this entry names an address literal or `localhost` exactly: only such
    /// entries may lead to loopback, private or link-local addresses.
    pub(crate) fn names_local_explicitly(&self) -> bool {
        match &self.host {
            HostPattern::Ip(_) => true,
            HostPattern::Name(n) => n == "localhost",
            HostPattern::Subdomains(_) => false,
        }
    }
}

impl fmt::Display for AllowEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostPattern::Name(n) => write!(f, "{n}")?,
            HostPattern::Subdomains(s) => write!(f, "*.{s}")?,
            HostPattern::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]")?,
            HostPattern::Ip(IpAddr::V4(ip)) => write!(f, "{ip}")?,
        }
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

/// Whether an address is one the public internet cannot route: loopback, private,
/// link-local, unspecified, multicast, CGNAT, unique-local. A name that resolves to one
/// of these is refused unless an entry names the address (or `localhost`) itself.
pub(crate) fn is_local_address(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_local_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_local_v4(v4);
            }
            let seg0 = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (seg0 & 0xfe00) == 0xfc00 // unique local
                || (seg0 & 0xffc0) == 0xfe80 // link local
                || v6 == Ipv6Addr::from(0u128)
        }
    }
}

fn is_local_v4(v4: Ipv4Addr) -> bool {
    let o = v4.octets();
    v4.is_loopback()
        || v4.is_private()
        || v4.is_link_local()
        || v4.is_unspecified()
        || v4.is_multicast()
        || v4.is_broadcast()
        || o[0] == 0
        || (o[0] == 100 && (o[1] & 0xc0) == 64) // 100.64/10, CGNAT
}

/// The parts of an `http(s)://[user[:pass]@]host[:port][/rest]` URL that matter for
/// allow lists and credentials. Not a general URL parser: anything else is `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UrlParts {
    pub scheme: String,
    /// Percent-decoded user and password, if the URL carries them.
    pub user: Option<String>,
    pub password: Option<String>,
    /// Lowercase; IPv6 without brackets.
    pub host: String,
    /// The explicit port, if any.
    pub port: Option<u16>,
    /// Everything from the first `/` after the authority (empty if none).
    pub rest: String,
}

impl UrlParts {
    /// Parse an `http://` or `https://` URL.
    pub(crate) fn parse(url: &str) -> Option<UrlParts> {
        let (scheme, after) = url.trim().split_once("://")?;
        let scheme = scheme.to_ascii_lowercase();
        if scheme != "http" && scheme != "https" {
            return None;
        }
        let end = after.find(['/', '?', '#']).unwrap_or(after.len());
        let (authority, rest) = after.split_at(end);
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            Some(u) => match u.split_once(':') {
                Some((a, b)) => (Some(percent_decode(a)), Some(percent_decode(b))),
                None => (Some(percent_decode(u)), None),
            },
            None => (None, None),
        };
        let (host, port) = split_host_port(hostport)?;
        let port = match port {
            Some(p) => Some(p.parse::<u16>().ok().filter(|&n| n != 0)?),
            None => None,
        };
        if host.is_empty() {
            return None;
        }
        Some(UrlParts {
            scheme,
            user,
            password,
            host: normalize(host),
            port,
            rest: rest.to_string(),
        })
    }

    /// The port in effect (the scheme's default when none is written).
    pub(crate) fn port_or_default(&self) -> u16 {
        self.port
            .unwrap_or(if self.scheme == "https" { 443 } else { 80 })
    }

    /// `host` or `host:port` as an allow-list entry (IPv6 bracketed).
    pub(crate) fn allow_entry(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        match self.port {
            Some(p) => format!("{host}:{p}"),
            None => host,
        }
    }

    /// The URL without user and password.
    pub(crate) fn without_credentials(&self) -> String {
        format!("{}://{}{}", self.scheme, self.allow_entry(), self.rest)
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Some(v) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Lowercase, without a trailing dot.
pub(crate) fn normalize(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`; a bare IPv6 literal has no port.
fn split_host_port(text: &str) -> Option<(&str, Option<&str>)> {
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return match after {
            "" => Some((host, None)),
            _ => Some((host, Some(after.strip_prefix(':')?))),
        };
    }
    if text.matches(':').count() > 1 {
        return text.parse::<Ipv6Addr>().is_ok().then_some((text, None));
    }
    match text.split_once(':') {
        Some((h, p)) => Some((h, Some(p))),
        None => Some((text, None)),
    }
}

fn parse_host(host: &str, entry: &str) -> Result<HostPattern, AllowError> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(HostPattern::Ip(ip));
    }
    let host = normalize(host);
    let (wild, name) = match host.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, host.as_str()),
    };
    if name.contains('*') || (wild && !name.contains('.')) {
        return Err(AllowError::Wildcard {
            entry: entry.to_string(),
        });
    }
    if !is_dns_name(name) {
        return Err(AllowError::NotAHost {
            entry: entry.to_string(),
        });
    }
    Ok(if wild {
        HostPattern::Subdomains(name.to_string())
    } else {
        HostPattern::Name(name.to_string())
    })
}

fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> AllowEntry {
        AllowEntry::parse(s).unwrap()
    }

    #[test]
    fn entries_parse_and_print_back() {
        for s in [
            "pypi.org",
            "*.example.com:443",
            "127.0.0.1:8000",
            "[::1]:8000",
            "localhost",
        ] {
            assert_eq!(p(s).to_string(), s);
        }
        assert_eq!(p("PyPI.org.").to_string(), "pypi.org");
        assert_eq!(p("::1").host, HostPattern::Ip("::1".parse().unwrap()));
    }

    #[test]
    fn bad_entries_say_what_is_allowed() {
        for (s, word) in [
            ("https://pypi.org", "not a host"),
            ("pypi.org/simple", "not a host"),
            ("user@pypi.org", "not a host"),
            ("", "not a host"),
            ("exa mple.com", "not a host"),
            ("*", "wildcard"),
            ("*.com", "wildcard"),
            ("py*.org", "wildcard"),
            ("a.*.org", "wildcard"),
            ("pypi.org:0", "port"),
            ("pypi.org:99999", "port"),
            ("pypi.org:http", "port"),
        ] {
            let e = AllowEntry::parse(s).unwrap_err().to_string();
            assert!(e.contains(word), "{s}: {e}");
        }
    }

    #[test]
    fn matching_hosts_and_ports() {
        let e = p("pypi.org");
        assert!(e.matches("pypi.org", 443) && e.matches("PYPI.ORG.", 80));
        assert!(!e.matches("pypi.org", 8080) && !e.matches("evil-pypi.org", 443));
        assert!(!e.matches("pypi.org.evil.example", 443));
        let w = p("*.example.com:443");
        assert!(w.matches("a.example.com", 443) && w.matches("a.b.example.com", 443));
        assert!(!w.matches("example.com", 443) && !w.matches("aexample.com", 443));
        assert!(!w.matches("a.example.com", 80));
        let ip = p("[::1]:8000");
        assert!(ip.matches("::1", 8000) && ip.matches("[::1]", 8000));
        assert!(!ip.matches("127.0.0.1", 8000));
        assert!(p("127.0.0.1:8000").matches("127.0.0.1", 8000));
    }

    #[test]
    fn urls_split_into_host_port_and_credentials() {
        let u = UrlParts::parse("https://us%40er:p%3Ass@Index.Example.com:8443/simple/").unwrap();
        assert_eq!(u.user.as_deref(), Some("us@er"));
        assert_eq!(u.password.as_deref(), Some("p:ss"));
        assert_eq!(u.allow_entry(), "index.example.com:8443");
        assert_eq!(
            u.without_credentials(),
            "https://index.example.com:8443/simple/"
        );
        let v = UrlParts::parse("http://[::1]:8000").unwrap();
        assert_eq!((v.host.as_str(), v.port_or_default()), ("::1", 8000));
        assert_eq!(
            UrlParts::parse("https://pypi.org")
                .unwrap()
                .port_or_default(),
            443
        );
        assert!(UrlParts::parse("file:///wheels").is_none());
        assert!(UrlParts::parse("http://host:99999/").is_none());
    }

    #[test]
    fn local_addresses() {
        for a in [
            "127.0.0.1",
            "10.1.2.3",
            "192.168.0.1",
            "169.254.169.254",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "0.0.0.0",
            "100.64.0.1",
        ] {
            assert!(is_local_address(a.parse().unwrap()), "{a}");
        }
        for a in ["151.101.0.223", "2a04:4e42::223"] {
            assert!(!is_local_address(a.parse().unwrap()), "{a}");
        }
        assert!(p("localhost").names_local_explicitly());
        assert!(!p("*.internal.example").names_local_explicitly());
    }
}
