/*
 * Non-blocking TCP helpers for the connection side channel, which stays open for a comm's
 * lifetime as its dead-peer detector, and interface selection (NCCL_MK_SOCKET_IFNAME).
 * Return 0 / negative errno like everything else.
 */
#ifndef MK_SOCK_H_
#define MK_SOCK_H_

#include <stddef.h>
#include <sys/socket.h>

#define MK_SOCK_BYE 'B' /* sent once before a graceful close */

enum mk_peer_state { MK_PEER_ALIVE, MK_PEER_BYE, MK_PEER_DEAD };

/* 1 when name is selected by an NCCL_MK_SOCKET_IFNAME list, NCCL_SOCKET_IFNAME's syntax:
 * comma-separated name prefixes, "=name" for an exact name, a leading '^' for "all but". */
int mk_sock_ifname_matches(const char* list, const char* name);
/* The address to listen on: the first interface that is up and matches NCCL_MK_SOCKET_IFNAME
 * (mk_sock_ifname_matches), IPv4 before IPv6; with the variable empty, the first non-loopback
 * interface, else loopback. ifname may be NULL. */
int mk_sock_pick_addr(struct sockaddr_storage* addr, char* ifname, size_t ifname_len);
/* Listening socket on addr (port 0: the kernel picks), non-blocking; *bound gets the port. */
int mk_sock_listen(const struct sockaddr_storage* addr, int* fd, struct sockaddr_storage* bound);
/* Starts a non-blocking connect; *fd is valid on 0. */
int mk_sock_connect_start(const struct sockaddr_storage* addr, int* fd);
/* 1 once connected, 0 while in progress, negative errno if it failed. */
int mk_sock_connect_poll(int fd);
/* 0 with *fd = -1 when nobody is waiting; the new socket is non-blocking. */
int mk_sock_accept(int listen_fd, int* fd);
/* Moves bytes [*off, len) without blocking: 1 when all are done, 0 if more remain,
 * -ECONNRESET when the peer closed, other negative errno on failure. */
int mk_sock_send_some(int fd, const void* buf, size_t len, size_t* off);
int mk_sock_recv_some(int fd, void* buf, size_t len, size_t* off);
/* Blocking (poll) versions bounded by timeout_ms, for benchmarks and tests. */
int mk_sock_send_all(int fd, const void* buf, size_t len, int timeout_ms);
int mk_sock_recv_all(int fd, void* buf, size_t len, int timeout_ms);
/* Whether the peer is alive, said bye, or vanished (EOF without bye, socket error). */
enum mk_peer_state mk_sock_peer_state(int fd);
/* Sends the bye byte (best effort) and closes. */
void mk_sock_close_graceful(int fd);
/* "a.b.c.d:port" or "[v6]:port" into buf. */
const char* mk_sock_addr_str(const struct sockaddr_storage* addr, char* buf, size_t len);

#endif /* MK_SOCK_H_ */
