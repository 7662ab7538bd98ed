//! Endpoints and roles: `--server` / `--client` give the role, and the endpoint's scheme the
//! fabric (`--fabric` only without an endpoint); `--server` without a value listens on the
//! fabric's default endpoint.

use super::Role;
use crate::cli::{CommonArgs, Fabric};
use crate::error::BenchError;

/// The role `--server` / `--client` give (neither: loopback) and the fabric: the endpoint's
/// scheme, else `--fabric`, else shm. `--server` without a value listens on the fabric's
/// default endpoint ([`default_server_endpoint`]). The fabric must be compiled in.
pub(super) fn role_of(c: &CommonArgs) -> Result<(Role, Fabric), BenchError> {
    let given = match (&c.role.server, &c.role.client) {
        (Some(ep), None) if !ep.is_empty() => Some(ep),
        (None, Some(ep)) => Some(ep),
        _ => None,
    };
    let fabric = match given {
        Some(ep) => {
            let f = fabric_of(ep)?;
            if let Some(flag) = c.fabric.filter(|&flag| flag != f) {
                return Err(BenchError::BadEndpoint {
                    endpoint: ep.clone(),
                    reason: format!(
                        "a {} endpoint, but --fabric is {}; the endpoint's scheme selects the fabric (drop --fabric)",
                        f.as_str(),
                        flag.as_str()
                    ),
                });
            }
            f
        }
        None => c.fabric.unwrap_or(Fabric::Shm),
    };
    if fabric == Fabric::Rdma && !cfg!(feature = "rdma") {
        return Err(BenchError::FabricNotCompiled { fabric: "rdma" });
    }
    let role = match (&c.role.server, &c.role.client) {
        (Some(ep), None) if ep.is_empty() => Role::Server(default_server_endpoint(fabric).into()),
        (Some(ep), None) => Role::Server(check_endpoint(ep, fabric)?),
        (None, Some(ep)) => Role::Client(check_endpoint(ep, fabric)?),
        _ => Role::Loopback,
    };
    Ok((role, fabric))
}

/// The endpoint a `--server` without a value listens on: `shm://spinwire-bench`,
/// `tcp://0.0.0.0:7471`, `rdma://0.0.0.0:7471` (mem:// has no server role).
pub fn default_server_endpoint(fabric: Fabric) -> &'static str {
    match fabric {
        Fabric::Shm | Fabric::Mem => crate::cli::DEFAULT_SERVER_ENDPOINT,
        Fabric::Tcp => "tcp://0.0.0.0:7471",
        Fabric::Rdma => "rdma://0.0.0.0:7471",
    }
}

/// The fabric an endpoint URL's scheme names.
///
/// # Errors
/// [`BenchError::BadEndpoint`] without a known `scheme://`.
pub fn fabric_of(ep: &str) -> Result<Fabric, BenchError> {
    let scheme = ep.split_once("://").map(|(s, _)| s);
    match scheme {
        Some("shm") => Ok(Fabric::Shm),
        Some("tcp") => Ok(Fabric::Tcp),
        Some("rdma") => Ok(Fabric::Rdma),
        Some("mem") => Ok(Fabric::Mem),
        Some(other) => Err(BenchError::BadEndpoint {
            endpoint: ep.into(),
            reason: format!("unknown scheme `{other}` (expected shm, tcp, rdma or mem)"),
        }),
        None => Err(BenchError::BadEndpoint {
            endpoint: ep.into(),
            reason: "expected shm://NAME, tcp://HOST:PORT, rdma://HOST:PORT or mem://NAME".into(),
        }),
    }
}

/// Checks that `ep`'s scheme matches `fabric`.
pub(super) fn check_endpoint(ep: &str, fabric: Fabric) -> Result<String, BenchError> {
    let Some((scheme, rest)) = ep.split_once("://") else {
        return Err(BenchError::BadEndpoint {
            endpoint: ep.into(),
            reason: "expected shm://NAME, tcp://HOST:PORT, rdma://HOST:PORT or mem://NAME".into(),
        });
    };
    if rest.is_empty() {
        return Err(BenchError::BadEndpoint {
            endpoint: ep.into(),
            reason: "nothing after the scheme".into(),
        });
    }
    match (scheme, fabric) {
        ("shm", Fabric::Shm)
        | ("rdma", Fabric::Rdma)
        | ("tcp", Fabric::Tcp)
        | ("mem", Fabric::Mem) => Ok(ep.to_string()),
        ("shm" | "rdma" | "tcp" | "mem", _) => Err(BenchError::BadEndpoint {
            endpoint: ep.into(),
            reason: format!(
                "a {scheme} endpoint, but --fabric is {}; pass --fabric {scheme}",
                fabric.as_str()
            ),
        }),
        _ => Err(BenchError::BadEndpoint {
            endpoint: ep.into(),
            reason: format!("unknown scheme `{scheme}` (expected shm, tcp, rdma or mem)"),
        }),
    }
}
