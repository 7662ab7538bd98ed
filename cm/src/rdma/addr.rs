//! Socket addresses: host name resolution and the `sockaddr` conversions rdma_cm needs.

use std::io;
use std::mem;
use std::net::{SocketAddr, ToSocketAddrs};
use std::ptr;

use super::CmError;

pub(super) fn sockaddr_from(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large enough and suitably aligned for sockaddr_in.
            unsafe { ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is large enough and suitably aligned for sockaddr_in6.
            unsafe { ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// Reads a `sockaddr` that rdma_cm filled in.
///
/// # Safety
/// `sa` must point to a valid sockaddr of the family it states (`sockaddr_storage` sized).
pub(super) unsafe fn sockaddr_to(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    // SAFETY: caller guarantees validity.
    unsafe {
        match i32::from((*sa).sa_family) {
            libc::AF_INET => {
                let sin = &*sa.cast::<libc::sockaddr_in>();
                Some(SocketAddr::from((
                    u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                    u16::from_be(sin.sin_port),
                )))
            }
            libc::AF_INET6 => {
                let sin6 = &*sa.cast::<libc::sockaddr_in6>();
                Some(SocketAddr::from((
                    sin6.sin6_addr.s6_addr,
                    u16::from_be(sin6.sin6_port),
                )))
            }
            _ => None,
        }
    }
}

/// Resolves `host:port` (or a literal address) to a socket address, preferring IPv4.
///
/// # Errors
/// [`CmError::Resolve`].
pub fn resolve_host(host: &str, port: u16) -> Result<SocketAddr, CmError> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|source| CmError::Resolve {
            host: host.to_owned(),
            source,
        })?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| CmError::Resolve {
            host: host.to_owned(),
            source: io::Error::new(io::ErrorKind::NotFound, "no address"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddr_roundtrip() {
        for a in ["10.0.2.15:7471", "[::1]:9"] {
            let a: SocketAddr = a.parse().unwrap();
            let (ss, _) = sockaddr_from(&a);
            // SAFETY: ss holds a valid sockaddr of its family.
            let back = unsafe { sockaddr_to((&ss as *const libc::sockaddr_storage).cast()) };
            assert_eq!(back, Some(a));
        }
    }
}
