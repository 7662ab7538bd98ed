//! Endpoint URLs: `shm://name`, `tcp://host:port` (IPv6: `tcp://[::1]:port`),
//! `rdma://host:port` and `mem://name` (in-process).

use crate::error::Error;

/// Longest `shm://` name (it becomes a Unix-socket name and a segment name).
pub const MAX_SHM_NAME: usize = cm::uds::MAX_NAME_LEN;

/// A parsed endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// Shared memory on this host, rendezvous by name.
    Shm {
        /// `[A-Za-z0-9._-]{1,64}`.
        name: String,
    },
    /// Kernel TCP.
    Tcp {
        /// Host name or address (IPv6 without its brackets).
        host: String,
        /// Port (0: any, for a listener).
        port: u16,
    },
    /// In-process (`fabric::mem`), by name: the same rules as an shm name.
    Mem {
        /// `[A-Za-z0-9._-]{1,64}`.
        name: String,
    },
    /// RDMA (RC queue pairs through rdma_cm). Only `fabric::rdma` reads the fields, so they are
    /// unread in a build without it.
    #[allow(dead_code)]
    Rdma {
        /// Host name or address.
        host: String,
        /// Port.
        port: u16,
    },
}

impl Endpoint {
    /// The URL scheme, which names the fabric ([`Fabric::NAME`](crate::fabric::Fabric::NAME)).
    pub(crate) fn scheme(&self) -> &'static str {
        match self {
            Endpoint::Shm { .. } => "shm",
            Endpoint::Tcp { .. } => "tcp",
            Endpoint::Rdma { .. } => "rdma",
            Endpoint::Mem { .. } => "mem",
        }
    }

    /// Parses `shm://name`, `tcp://host:port` or `rdma://host:port`.
    ///
    /// # Errors
    ///
    /// [`Error::BadEndpoint`] for anything else, [`Error::FabricNotCompiled`] for `rdma://` in a
    /// build without the `rdma` feature.
    pub(crate) fn parse(s: &str) -> Result<Endpoint, Error> {
        let bad = |reason: &'static str| Error::BadEndpoint {
            endpoint: s.to_owned(),
            reason,
        };
        let Some((scheme, rest)) = s.split_once("://") else {
            return Err(bad(
                "expected scheme://address, e.g. shm://name, tcp://host:port or rdma://host:port",
            ));
        };
        match scheme {
            "shm" | "mem" => {
                if rest.is_empty() {
                    return Err(bad("empty shm name"));
                }
                if rest.len() > MAX_SHM_NAME {
                    return Err(bad("shm name longer than 64 bytes"));
                }
                if !rest
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
                {
                    return Err(bad("shm name may only contain A-Z a-z 0-9 . _ -"));
                }
                if rest.starts_with('.') {
                    return Err(bad("shm name may not start with '.'"));
                }
                let name = rest.to_owned();
                Ok(if scheme == "mem" {
                    Endpoint::Mem { name }
                } else {
                    Endpoint::Shm { name }
                })
            }
            "tcp" => {
                let Some((host, port)) = rest.rsplit_once(':') else {
                    return Err(bad("expected tcp://host:port"));
                };
                let host = match host.strip_prefix('[') {
                    Some(h) => match h.strip_suffix(']') {
                        Some(h) if h.parse::<std::net::Ipv6Addr>().is_ok() => h,
                        _ => return Err(bad("expected tcp://[ipv6]:port")),
                    },
                    None if host.contains(':') => {
                        return Err(bad("an IPv6 tcp host needs brackets: tcp://[::1]:port"))
                    }
                    None => host,
                };
                if host.is_empty() {
                    return Err(bad("empty tcp host"));
                }
                let Ok(port) = port.parse::<u16>() else {
                    return Err(bad("tcp port must be a number in 0..=65535"));
                };
                Ok(Endpoint::Tcp {
                    host: host.to_owned(),
                    port,
                })
            }
            "rdma" => {
                let Some((host, port)) = rest.rsplit_once(':') else {
                    return Err(bad("expected rdma://host:port"));
                };
                let host = host.trim_start_matches('[').trim_end_matches(']');
                if host.is_empty() {
                    return Err(bad("empty rdma host"));
                }
                let Ok(port) = port.parse::<u16>() else {
                    return Err(bad("rdma port must be a number in 0..=65535"));
                };
                // Parsed in every build: a build without the fabric refuses it when the engine
                // looks the scheme up ([`Error::FabricNotCompiled`] from listen / connect).
                Ok(Endpoint::Rdma {
                    host: host.to_owned(),
                    port,
                })
            }
            "" => Err(bad("empty scheme")),
            _ => Err(bad("unknown scheme (supported: shm, tcp, rdma, mem)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_shm() {
        assert_eq!(
            Endpoint::parse("shm://a-b_c.1").unwrap(),
            Endpoint::Shm {
                name: "a-b_c.1".into()
            }
        );
    }

    #[test]
    fn rejects_bad() {
        for s in [
            "",
            "shm",
            "shm:/x",
            "shm://",
            "shm://a/b",
            "shm://..",
            "tcpx://x:1",
            "tcp://x",
            "tcp://:1",
            "tcp://h:99999",
            "tcp://::1:5",
            "tcp://[::1:5",
            "tcp://[zz]:5",
            "://x",
            "shm://a b",
            "rdma://host",
            "rdma://:1",
            "rdma://h:99999",
        ] {
            assert!(
                matches!(Endpoint::parse(s), Err(Error::BadEndpoint { .. })),
                "{s}"
            );
        }
        let long = format!("shm://{}", "x".repeat(MAX_SHM_NAME + 1));
        assert!(matches!(
            Endpoint::parse(&long),
            Err(Error::BadEndpoint { .. })
        ));
    }

    #[test]
    fn parses_mem() {
        assert_eq!(
            Endpoint::parse("mem://a-b_c.1").unwrap(),
            Endpoint::Mem {
                name: "a-b_c.1".into()
            }
        );
        for s in ["mem://", "mem://a/b", "mem://.x"] {
            assert!(
                matches!(Endpoint::parse(s), Err(Error::BadEndpoint { .. })),
                "{s}"
            );
        }
    }

    #[test]
    fn parses_tcp() {
        assert_eq!(
            Endpoint::parse("tcp://127.0.0.1:7000").unwrap(),
            Endpoint::Tcp {
                host: "127.0.0.1".into(),
                port: 7000
            }
        );
        assert_eq!(
            Endpoint::parse("tcp://[::1]:7001").unwrap(),
            Endpoint::Tcp {
                host: "::1".into(),
                port: 7001
            }
        );
        assert_eq!(
            Endpoint::parse("tcp://localhost:0").unwrap().scheme(),
            "tcp"
        );
    }

    #[test]
    fn rdma_parses_in_every_build() {
        // Whether the fabric is compiled in is decided at listen / connect
        // (`Error::FabricNotCompiled`, tested in tests/flow.rs), not by the parser.
        assert_eq!(
            Endpoint::parse("rdma://10.0.0.1:7471").unwrap().scheme(),
            "rdma"
        );
    }
}
