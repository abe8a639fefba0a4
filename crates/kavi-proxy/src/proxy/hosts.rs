//! Which hosts a confined process may reach through the proxy: `[processes] allowed_hosts`
//! entries, how a target matches them, and the addresses a listed name may not lead to.

use std::net::IpAddr;

/// One entry of `[processes] allowed_hosts`: `host`, `host:port`, `*.domain`, `*.domain:port`,
/// an IPv4 address, or an IPv6 one (`::1`, or `[::1]:443` with a port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    pub(super) text: String,
    pub(super) host: Host,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Host {
    Ip(IpAddr),
    /// Lowercase, without a trailing dot.
    Name(String),
    /// `*.suffix`: any name below `suffix`, not `suffix` itself.
    Below(String),
}

impl HostPattern {
    /// Parses an entry; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Some((_, rest)) = text.split_once("://") {
            let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
            return Err(format!(
                "`{text}` is a URL: write the host alone (`{host}`), or `host:port`"
            ));
        }
        let (host, port) = split_port(text)?;
        let host = if let Some(ip) = ip_literal(host) {
            Host::Ip(ip)
        } else if let Some(suffix) = host.strip_prefix("*.") {
            Host::Below(host_name(suffix).ok_or_else(|| {
                format!("`{text}`: `*.` must be followed by a host name, such as `*.example.com`")
            })?)
        } else if host == "*" {
            return Err(format!(
                "`{text}` would allow every host; list the hosts a process may reach"
            ));
        } else {
            Host::Name(host_name(host).ok_or_else(|| {
                format!(
                    "`{text}` is not a host name, `*.domain`, or IP address (with an optional \
                     `:port`)"
                )
            })?)
        };
        Ok(Self {
            text: text.to_owned(),
            host,
            port,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    fn matches(&self, target: &Host, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        match (&self.host, target) {
            (Host::Ip(a), Host::Ip(b)) => a.to_canonical() == b.to_canonical(),
            (Host::Name(a), Host::Name(b)) => a == b,
            (Host::Below(suffix), Host::Name(name)) => name
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            _ => false,
        }
    }
}

/// `host` and its port, if any. An IPv6 address with a port is bracketed; one without may be
/// bare.
fn split_port(text: &str) -> Result<(&str, Option<u16>), String> {
    let port = |p: &str| {
        p.parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("`{text}`: `{p}` is not a port (1 to 65535)"))
    };
    if let Some(rest) = text.strip_prefix('[') {
        let (ip, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("`{text}`: `[` without its `]`"))?;
        return match after {
            "" => Ok((ip, None)),
            _ => match after.strip_prefix(':') {
                Some(p) => Ok((ip, Some(port(p)?))),
                None => Err(format!("`{text}`: only `:port` may follow `]`")),
            },
        };
    }
    match text.matches(':').count() {
        0 => Ok((text, None)),
        1 => {
            let (host, p) = text.split_once(':').unwrap_or((text, ""));
            Ok((host, Some(port(p)?)))
        }
        // A bare IPv6 address: no port.
        _ => Ok((text, None)),
    }
}

/// An IP address, bracketed or not, written the standard way (not `127.1` or `0x7f.0.0.1`).
pub(super) fn ip_literal(host: &str) -> Option<IpAddr> {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

/// A DNS name, lowercased, without its trailing dot; `None` for anything that is not one.
pub(super) fn host_name(host: &str) -> Option<String> {
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let valid = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    valid.then_some(host)
}

/// The hosts confined processes may reach through the proxy: empty, none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostAllowlist {
    pub entries: Vec<HostPattern>,
}

/// Whether a target may be reached, and by which entry.
#[derive(Debug)]
pub(super) enum Decision<'a> {
    Allowed(&'a HostPattern),
    Refused(String),
}

impl HostAllowlist {
    pub fn texts(&self) -> Vec<&str> {
        self.entries.iter().map(HostPattern::as_str).collect()
    }

    pub(super) fn decide(&self, host: &str, port: u16) -> Decision<'_> {
        let target = match ip_literal(host) {
            Some(ip) => Host::Ip(ip),
            None => match host_name(host) {
                Some(name) => Host::Name(name),
                None => return Decision::Refused(format!("`{host}` is not a host name")),
            },
        };
        match self.entries.iter().find(|e| e.matches(&target, port)) {
            Some(entry) => Decision::Allowed(entry),
            None => Decision::Refused(
                "not in [processes] allowed_hosts of policies/network.toml".to_owned(),
            ),
        }
    }
}

/// An address only an entry naming it may lead to: this machine (any address of its own), its
/// link (a cloud's metadata service), a private network behind it, nowhere, or a group. A
/// public name that resolves to one of these is how a process would reach a service the host
/// only offers inward.
pub(super) fn special(ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    reserved(ip) || this_machine().contains(&ip)
}

fn reserved(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [first, second, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || first == 0
                // Shared address space (RFC 6598): a carrier's or a cloud's inside network.
                || (first == 100 && (64..128).contains(&second))
                // IETF protocol assignments, benchmarking networks, reserved for future use.
                || (first == 192 && second == 0 && v4.octets()[2] == 0)
                || (first == 198 && (18..20).contains(&second))
                || first >= 240
        }
        IpAddr::V6(v6) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || v6.is_unicast_link_local()
                || v6.is_unique_local()
                // NAT64 (64:ff9b::/96, 64:ff9b:1::/48) and 6to4 (2002::/16) carry an IPv4
                // address a gateway reaches for the asker: a private one among them.
                || matches!(v6.segments(), [0x64, 0xff9b, ..])
                || v6.segments()[0] == 0x2002
        }
    }
}

/// Every address of this machine's interfaces, read when asked: an address the host has is
/// reached from the host's side of the proxy, whatever range it is in.
fn this_machine() -> Vec<IpAddr> {
    let Ok(interfaces) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    interfaces
        .filter_map(|interface| interface.address)
        .filter_map(|address| {
            address
                .as_sockaddr_in()
                .map(|v4| IpAddr::V4(v4.ip()))
                .or_else(|| address.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
        })
        .map(|ip| ip.to_canonical())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::{Reach, reach};

    fn list(entries: &[&str]) -> HostAllowlist {
        HostAllowlist {
            entries: entries
                .iter()
                .map(|e| HostPattern::parse(e).unwrap())
                .collect(),
        }
    }

    fn allowed(list: &HostAllowlist, host: &str, port: u16) -> bool {
        matches!(list.decide(host, port), Decision::Allowed(_))
    }

    #[test]
    fn entries_match_by_name_port_and_suffix_and_nothing_else() {
        let hosts = list(&[
            "api.example.com",
            "pypi.org:443",
            "*.githubusercontent.com",
            "127.0.0.1:8080",
            "[::1]:9000",
            "fe80::1",
        ]);
        assert!(allowed(&hosts, "api.example.com", 443));
        assert!(allowed(&hosts, "API.Example.COM.", 80));
        assert!(allowed(&hosts, "pypi.org", 443));
        assert!(!allowed(&hosts, "pypi.org", 80));
        assert!(allowed(&hosts, "raw.githubusercontent.com", 443));
        assert!(!allowed(&hosts, "githubusercontent.com", 443));
        assert!(!allowed(&hosts, "evilgithubusercontent.com", 443));
        assert!(!allowed(&hosts, "githubusercontent.com.evil.org", 443));
        assert!(!allowed(&hosts, "example.com", 443));
        assert!(!allowed(&hosts, "sub.api.example.com", 443));
        assert!(allowed(&hosts, "127.0.0.1", 8080));
        assert!(!allowed(&hosts, "127.0.0.1", 8081));
        // Other spellings of an address are names, and no name entry lists them.
        assert!(!allowed(&hosts, "127.1", 8080));
        assert!(!allowed(&hosts, "2130706433", 8080));
        assert!(!allowed(&hosts, "localhost", 8080));
        assert!(allowed(&hosts, "[::1]", 9000));
        assert!(allowed(&hosts, "[0:0:0:0:0:0:0:1]", 9000));
        assert!(allowed(&hosts, "[::ffff:127.0.0.1]", 8080));
        assert!(allowed(&hosts, "[fe80::1]", 1));
        // An allowed name does not allow its address.
        assert!(!allowed(&hosts, "93.184.216.34", 443));
        assert!(!allowed(&hosts, "api.example.com\0.evil", 443));
        assert!(!allowed(&hosts, "", 443));
        assert!(!allowed(&list(&[]), "api.example.com", 443));
    }

    #[test]
    fn malformed_entries_say_what_is_wrong() {
        for (entry, says) in [
            ("*", "every host"),
            ("*.", "`*.` must be followed"),
            ("host:0", "not a port"),
            ("host:99999", "not a port"),
            ("host:http", "not a port"),
            ("[::1", "without its `]`"),
            ("[::1]x", "only `:port`"),
            ("exa mple.com", "not a host name"),
            (
                "https://example.com/x",
                "is a URL: write the host alone (`example.com`)",
            ),
            ("a.*.com", "not a host name"),
            ("", "not a host name"),
        ] {
            let err = HostPattern::parse(entry).unwrap_err();
            assert!(err.contains(says), "{entry}: {err}");
        }
    }

    #[test]
    fn addresses_of_this_machine_its_link_and_private_networks_are_special() {
        for ip in [
            "127.0.0.1",
            "127.8.9.10",
            "169.254.169.254",
            "0.0.0.0",
            "::1",
            "::ffff:127.0.0.1",
            "fe80::1",
            "224.0.0.1",
            "10.0.0.1",
            "172.16.5.4",
            "192.168.1.1",
            "100.64.0.1",
            "fd00::1",
            "::ffff:192.168.0.1",
            "64:ff9b::a00:1",
            "64:ff9b:1::1",
            "2002:a00:1::1",
            "198.18.0.1",
            "240.0.0.1",
            "192.0.0.8",
        ] {
            assert!(special(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["93.184.216.34", "100.128.0.1", "172.32.0.1", "2606:4700::1"] {
            assert!(!special(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn the_addresses_of_this_machine_are_read_from_its_interfaces() {
        let own = this_machine();
        assert!(
            own.iter().any(IpAddr::is_loopback),
            "getifaddrs listed no loopback address: {own:?}"
        );
    }

    proptest::proptest! {
        /// Whatever a policy or a process writes, parsing and matching answer, never panic.
        #[test]
        fn no_entry_or_target_makes_matching_panic(entry in ".{0,40}", host in ".{0,40}", port: u16) {
            let hosts = HostAllowlist {
                entries: HostPattern::parse(&entry).into_iter().collect(),
            };
            let _ = hosts.decide(&host, port);
            let _ = split_port(&host);
        }
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_loopback_is_refused_unless_its_address_is_listed() {
        let hosts = list(&["localhost"]);
        match reach(&hosts, "localhost", 9).await {
            Err(Reach::Refused(reason)) => assert!(reason.contains("resolves to"), "{reason}"),
            _ => panic!("reached loopback through a name"),
        }
    }
}
