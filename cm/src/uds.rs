//! Unix-domain-socket rendezvous for the shm fabric (work in progress).
