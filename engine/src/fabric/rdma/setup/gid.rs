//! The GID-index override ([`EngineBuilder::rdma_gid_index`](crate::EngineBuilder::rdma_gid_index),
//! env `SPINWIRE_RDMA_GID_INDEX`): finding, checking and logging the GID-table entry, and reading
//! back the index a connection really uses.
//!
//! rdma_cm has no call to pick a source GID index: it takes the GID that owns the id's source
//! address when it resolves the address. So the override works through the address:
//!
//! - **Active side** ([`for_connect`]): a first resolution to the destination finds the device
//!   and port rdma_cm routes through; entry `index` of that port's GID table must exist, be
//!   non-empty and IP-based (RoCE: an IPv4-mapped `::ffff:a.b.c.d` or an IPv6 GID) and of the
//!   destination's family. The connection is then resolved from that address as source
//!   ([`cm::rdma::resolve_from`]), and once it is established the QP's `sgid_index`
//!   ([`QueuePair::sgid_index`]) is compared with the override ([`check_readback`]): where two
//!   entries hold the same address (the RoCE v1 and v2 entries of one IP), rdma_cm takes the one
//!   of the port's default RoCE mode, and a different choice fails the connect with
//!   [`RdmaSetupError::GidMismatch`], which says how to change that mode.
//! - **Passive side**: an accepted connection's GID follows the address the client connected
//!   to; the override plays no part there, except that a listener on the wildcard address binds
//!   to the override's address instead ([`for_listener`]), so clients can only reach it
//!   through that GID.
//!
//! Everything here runs on the control plane (connecting thread, control thread) and logs with
//! `tracing`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

use cm::rdma::CmId;

use crate::fabric::rdma::error::RdmaSetupError;
use crate::fabric::rdma::verbs::{Context, QueuePair};

/// What a GID-table entry holds, as far as addressing goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GidAddr {
    /// All zeros: no GID at that index.
    Empty,
    /// An IPv4-mapped GID (`::ffff:a.b.c.d`).
    V4(Ipv4Addr),
    /// Any other GID, read as an IPv6 address (meaningful as one on an Ethernet link layer).
    V6(Ipv6Addr),
}

/// Reads the raw 16 bytes of a GID.
pub(crate) fn classify(raw: [u8; 16]) -> GidAddr {
    let v6 = Ipv6Addr::from(raw);
    if v6.is_unspecified() {
        GidAddr::Empty
    } else if let Some(v4) = v6.to_ipv4_mapped() {
        GidAddr::V4(v4)
    } else {
        GidAddr::V6(v6)
    }
}

/// A checked GID-table entry of the override.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GidChoice {
    pub(crate) device: String,
    pub(crate) port: u8,
    pub(crate) index: u8,
    pub(crate) gid: Ipv6Addr,
    /// The GID type from sysfs (`RoCE v2`, `IB/RoCE v1`), or `unknown`.
    pub(crate) gid_type: String,
    /// The address the GID stands for.
    pub(crate) ip: IpAddr,
    /// For a link-local IPv6 GID: the index of its network interface (else 0).
    pub(crate) scope_id: u32,
}

impl GidChoice {
    /// The source address (port 0) that makes rdma_cm take this GID towards `dst`.
    ///
    /// # Errors
    /// [`RdmaSetupError::GidFamily`] when `dst` is of the other address family.
    pub(crate) fn source_for(&self, dst: SocketAddr) -> Result<SocketAddr, RdmaSetupError> {
        match (self.ip, dst) {
            (IpAddr::V4(ip), SocketAddr::V4(_)) => Ok(SocketAddr::new(IpAddr::V4(ip), 0)),
            (IpAddr::V6(ip), SocketAddr::V6(_)) => {
                Ok(SocketAddr::V6(SocketAddrV6::new(ip, 0, 0, self.scope_id)))
            }
            _ => Err(RdmaSetupError::GidFamily {
                device: self.device.clone(),
                port: self.port,
                index: self.index,
                gid: self.gid,
                dst,
            }),
        }
    }
}

/// The GID type of an entry, from sysfs, or `unknown`.
pub(crate) fn gid_type(device: &str, port: u8, index: u8) -> String {
    std::fs::read_to_string(format!(
        "/sys/class/infiniband/{device}/ports/{port}/gid_attrs/types/{index}"
    ))
    .map(|s| s.trim().to_owned())
    .ok()
    .filter(|s| !s.is_empty())
    .unwrap_or_else(|| "unknown".to_owned())
}

/// The network interface index of a GID entry (for a link-local IPv6 source), from sysfs; 0
/// when unknown.
fn gid_ifindex(device: &str, port: u8, index: u8) -> u32 {
    let Ok(name) = std::fs::read_to_string(format!(
        "/sys/class/infiniband/{device}/ports/{port}/gid_attrs/ndevs/{index}"
    )) else {
        return 0;
    };
    let Ok(name) = std::ffi::CString::new(name.trim()) else {
        return 0;
    };
    // SAFETY: `name` is a valid NUL-terminated string; if_nametoindex only reads it.
    unsafe { libc::if_nametoindex(name.as_ptr()) }
}

/// Checks entry `index` of `port`'s GID table on `ctx`: in the table, not empty, IP-based.
///
/// # Errors
/// [`RdmaSetupError::GidQuery`], [`RdmaSetupError::GidIndexOutOfRange`],
/// [`RdmaSetupError::GidEmpty`], [`RdmaSetupError::GidNotIp`].
pub(crate) fn lookup(ctx: &Context, port: u8, index: u8) -> Result<GidChoice, RdmaSetupError> {
    let device = ctx.name();
    let query = |source| RdmaSetupError::GidQuery {
        device: device.clone(),
        port,
        index,
        source,
    };
    let table = ctx.query_port_gids(port).map_err(query)?;
    if u32::from(index) >= table.table_len {
        return Err(RdmaSetupError::GidIndexOutOfRange {
            device,
            port,
            index,
            table_len: table.table_len,
        });
    }
    let raw = ctx.query_gid(port, index).map_err(query)?;
    let gid = Ipv6Addr::from(raw);
    let not_ip = |why| RdmaSetupError::GidNotIp {
        device: device.clone(),
        port,
        index,
        gid,
        why,
    };
    let ip = match classify(raw) {
        GidAddr::Empty => {
            return Err(RdmaSetupError::GidEmpty {
                device,
                port,
                index,
            })
        }
        _ if ctx.is_iwarp() => {
            return Err(not_ip(
                "an iWARP device: rdma_cm connects through the IP stack, not the GID table",
            ))
        }
        _ if !table.ethernet => {
            return Err(not_ip(
                "an InfiniBand port: its GIDs are a subnet prefix and a port GUID",
            ))
        }
        GidAddr::V4(v4) => IpAddr::V4(v4),
        GidAddr::V6(v6) => IpAddr::V6(v6),
    };
    let scope_id = match ip {
        // fe80::/10 (`Ipv6Addr::is_unicast_link_local` needs Rust 1.84; the MSRV is 1.80).
        IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80 => gid_ifindex(&device, port, index),
        _ => 0,
    };
    Ok(GidChoice {
        gid_type: gid_type(&device, port, index),
        device,
        port,
        index,
        gid,
        ip,
        scope_id,
    })
}

/// Active side: entry `index` on the device and port that `probe` (an id resolved to the
/// destination `dst`) routes through, and the source address that selects it. Logged at info.
///
/// # Errors
/// [`RdmaSetupError::NoDevice`], the errors of [`lookup`] and of [`GidChoice::source_for`].
pub(crate) fn for_connect(
    probe: &CmId,
    index: u8,
    dst: SocketAddr,
) -> Result<(GidChoice, SocketAddr), RdmaSetupError> {
    let dev = probe.device_context().ok_or(RdmaSetupError::NoDevice)?;
    let ctx = Context::from_cm(dev);
    let choice = lookup(&ctx, probe.port_num(), index)?;
    let src = choice.source_for(dst)?;
    tracing::info!(
        device = %choice.device,
        port = choice.port,
        gid_index = choice.index,
        gid = %choice.gid,
        gid_type = %choice.gid_type,
        source = %src,
        peer = %dst,
        "rdma gid index override: resolving the route from the GID's address"
    );
    Ok((choice, src))
}

/// Active side, once established: fails unless the QP uses the override's GID index. Logged at
/// info when it does.
///
/// # Errors
/// [`RdmaSetupError::Verbs`] if the QP cannot be queried, [`RdmaSetupError::GidMismatch`].
pub(crate) fn check_readback(choice: &GidChoice, qp: &QueuePair) -> Result<(), RdmaSetupError> {
    let chosen = qp.sgid_index().map_err(|source| RdmaSetupError::Verbs {
        step: "read back the QP's source GID index",
        source,
    })?;
    check_index(choice, chosen)?;
    tracing::info!(
        device = %choice.device,
        port = choice.port,
        gid_index = choice.index,
        gid = %choice.gid,
        gid_type = %choice.gid_type,
        "rdma gid index override in effect (QP sgid_index read back)"
    );
    Ok(())
}

/// [`RdmaSetupError::GidMismatch`] unless `chosen` is the override's index.
fn check_index(choice: &GidChoice, chosen: u8) -> Result<(), RdmaSetupError> {
    if chosen == choice.index {
        return Ok(());
    }
    Err(RdmaSetupError::GidMismatch {
        device: choice.device.clone(),
        port: choice.port,
        index: choice.index,
        requested_type: choice.gid_type.clone(),
        chosen,
        chosen_type: gid_type(&choice.device, choice.port, chosen),
    })
}

/// Passive side, listener on the wildcard address of family `ipv4` (else IPv6): the first
/// device port (in libibverbs' device order, ports from 1) whose entry `index` is a usable IP
/// GID of that family. Logged at info by the caller.
///
/// # Errors
/// [`RdmaSetupError::Verbs`] when no device opens, [`RdmaSetupError::NoGidForListener`].
pub(crate) fn for_listener(index: u8, ipv4: bool) -> Result<GidChoice, RdmaSetupError> {
    let devices = Context::open_all().map_err(|source| RdmaSetupError::Verbs {
        step: "open RDMA devices for the gid index override",
        source,
    })?;
    for ctx in &devices {
        let ports = ctx.port_count().unwrap_or(0);
        for port in 1..=ports {
            match lookup(ctx, port, index) {
                Ok(c) if c.ip.is_ipv4() == ipv4 => return Ok(c),
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "gid index override: entry not usable"),
            }
        }
    }
    Err(RdmaSetupError::NoGidForListener {
        index,
        family: if ipv4 { "IPv4" } else { "IPv6" },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(ip: IpAddr) -> GidChoice {
        GidChoice {
            device: "rxe0".into(),
            port: 1,
            index: 3,
            gid: match ip {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            },
            gid_type: "RoCE v2".into(),
            ip,
            scope_id: 0,
        }
    }

    #[test]
    fn gids_classify_as_empty_ipv4_mapped_or_ipv6() {
        assert_eq!(classify([0; 16]), GidAddr::Empty);
        let v4: Ipv4Addr = "10.0.2.15".parse().unwrap();
        assert_eq!(classify(v4.to_ipv6_mapped().octets()), GidAddr::V4(v4));
        let ll: Ipv6Addr = "fe80::5054:ff:fe12:3456".parse().unwrap();
        assert_eq!(classify(ll.octets()), GidAddr::V6(ll));
        let g: Ipv6Addr = "2001:db8::1".parse().unwrap();
        assert_eq!(classify(g.octets()), GidAddr::V6(g));
        // `::a.b.c.d` (IPv4-compatible, deprecated) is not a mapped GID.
        let compat: Ipv6Addr = "::10.0.2.15".parse().unwrap();
        assert_eq!(classify(compat.octets()), GidAddr::V6(compat));
    }

    #[test]
    fn source_address_follows_the_gid_and_must_match_the_destination_family() {
        let c4 = choice("10.0.2.15".parse().unwrap());
        let dst4: SocketAddr = "10.0.2.16:7471".parse().unwrap();
        let dst6: SocketAddr = "[2001:db8::2]:7471".parse().unwrap();
        assert_eq!(c4.source_for(dst4).unwrap(), "10.0.2.15:0".parse().unwrap());
        let e = c4.source_for(dst6).unwrap_err();
        assert!(
            matches!(&e, RdmaSetupError::GidFamily { device, port: 1, index: 3, .. } if device == "rxe0"),
            "{e:?}"
        );
        assert!(e.to_string().contains("address families differ"), "{e}");
        let mut c6 = choice("fe80::1".parse().unwrap());
        c6.scope_id = 7;
        let SocketAddr::V6(src) = c6.source_for(dst6).unwrap() else {
            panic!("IPv6 source expected");
        };
        assert_eq!(
            (src.ip().to_string().as_str(), src.port(), src.scope_id()),
            ("fe80::1", 0, 7)
        );
        assert!(c6.source_for(dst4).is_err());
    }

    #[test]
    fn readback_of_another_index_is_a_typed_mismatch_naming_device_port_and_both_indexes() {
        let c = choice("10.0.2.15".parse().unwrap());
        assert!(check_index(&c, 3).is_ok());
        let e = check_index(&c, 1).unwrap_err();
        match &e {
            RdmaSetupError::GidMismatch {
                device,
                port,
                index,
                requested_type,
                chosen,
                ..
            } => {
                assert_eq!(
                    (
                        device.as_str(),
                        *port,
                        *index,
                        requested_type.as_str(),
                        *chosen
                    ),
                    ("rxe0", 1, 3, "RoCE v2", 1)
                );
            }
            other => panic!("expected GidMismatch, got {other:?}"),
        }
        let text = e.to_string();
        assert!(text.contains("default_roce_mode"), "{text}");
        assert!(text.contains("gid index 1"), "{text}");
    }

    #[test]
    fn gid_errors_name_device_port_and_index() {
        let e = RdmaSetupError::GidEmpty {
            device: "rxe0".into(),
            port: 1,
            index: 200,
        };
        let t = e.to_string();
        assert!(
            t.contains("rxe0") && t.contains("port 1") && t.contains("200"),
            "{t}"
        );
        let e = RdmaSetupError::GidIndexOutOfRange {
            device: "mlx5_0".into(),
            port: 2,
            index: 255,
            table_len: 128,
        };
        let t = e.to_string();
        assert!(
            t.contains("mlx5_0") && t.contains("port 2") && t.contains("255") && t.contains("128"),
            "{t}"
        );
    }
}
