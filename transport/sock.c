#include "sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "mk_clock.h"
#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"

static socklen_t addr_len(const struct sockaddr_storage* a) {
  return a->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

const char* mk_sock_addr_str(const struct sockaddr_storage* addr, char* buf, size_t len) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (addr->ss_family == AF_INET) {
    const struct sockaddr_in* a = (const struct sockaddr_in*)addr;
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
    snprintf(buf, len, "%s:%d", host, port);
  } else {
    const struct sockaddr_in6* a = (const struct sockaddr_in6*)addr;
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
    snprintf(buf, len, "[%s]:%d", host, port);
  }
  return buf;
}

int mk_sock_ifname_matches(const char* list, const char* name) {
  const int exclude = list[0] == '^';
  char tmp[256];
  snprintf(tmp, sizeof(tmp), "%s", list + exclude);
  int hit = 0;
  for (char *save = NULL, *tok = strtok_r(tmp, ",", &save); tok && !hit; tok = strtok_r(NULL, ",", &save))
    hit = tok[0] == '=' ? strcmp(tok + 1, name) == 0 : strncmp(tok, name, strlen(tok)) == 0;
  return hit != exclude;
}

/* One pass over the interfaces for one family; loopback selects loopback or not. */
static int pick_pass(struct ifaddrs* ifs, const char* want, int family, int loopback,
                     struct sockaddr_storage* out, char* ifname, size_t ifname_len) {
  for (struct ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != family || !(i->ifa_flags & IFF_UP)) continue;
    if (want[0] ? !mk_sock_ifname_matches(want, i->ifa_name) : !!(i->ifa_flags & IFF_LOOPBACK) != loopback)
      continue;
    if (family == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6*)i->ifa_addr)->sin6_addr))
      continue; /* link-local needs a scope id the peer does not know */
    memset(out, 0, sizeof(*out));
    memcpy(out, i->ifa_addr, family == AF_INET ? sizeof(struct sockaddr_in)
                                               : sizeof(struct sockaddr_in6));
    if (ifname) snprintf(ifname, ifname_len, "%s", i->ifa_name);
    return 1;
  }
  return 0;
}

int mk_sock_pick_addr(struct sockaddr_storage* addr, char* ifname, size_t ifname_len) {
  const char* want = mk_param_str(MK_PARAM_SOCKET_IFNAME);
  struct ifaddrs* ifs = NULL;
  if (getifaddrs(&ifs) != 0) {
    MK_WARN("getifaddrs failed: %s", strerror(errno));
    return -errno;
  }
  int found = 0;
  for (int lb = 0; lb < 2 && !found; lb++) {
    found = pick_pass(ifs, want, AF_INET, lb, addr, ifname, ifname_len) ||
            pick_pass(ifs, want, AF_INET6, lb, addr, ifname, ifname_len);
    if (want[0]) break; /* an explicit choice never falls back to loopback */
  }
  freeifaddrs(ifs);
  if (!found) {
    MK_WARN("no usable network interface%s%s", want[0] ? " matches NCCL_MK_SOCKET_IFNAME=" : "",
            want);
    return -ENODEV;
  }
  return 0;
}

static int sock_new(int family, int* fd) {
  *fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (*fd < 0) {
    MK_WARN("socket() failed: %s", strerror(errno));
    return -errno;
  }
  int one = 1;
  setsockopt(*fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return 0;
}

int mk_sock_listen(const struct sockaddr_storage* addr, int* fd, struct sockaddr_storage* bound) {
  MK_CHECK(sock_new(addr->ss_family, fd));
  struct sockaddr_storage a = *addr;
  ((struct sockaddr_in*)&a)->sin_port = 0; /* same offset for sin6_port */
  socklen_t len = addr_len(&a);
  if (bind(*fd, (struct sockaddr*)&a, len) != 0 || listen(*fd, 128) != 0 ||
      getsockname(*fd, (struct sockaddr*)bound, &len) != 0) {
    int rc = -errno;
    char s[64];
    MK_WARN("cannot listen on %s: %s", mk_sock_addr_str(&a, s, sizeof(s)), strerror(errno));
    close(*fd);
    *fd = -1;
    return rc;
  }
  return 0;
}

int mk_sock_connect_start(const struct sockaddr_storage* addr, int* fd) {
  MK_CHECK(sock_new(addr->ss_family, fd));
  if (connect(*fd, (const struct sockaddr*)addr, addr_len(addr)) != 0 && errno != EINPROGRESS) {
    int rc = -errno;
    char s[64];
    MK_WARN("connect to %s failed: %s", mk_sock_addr_str(addr, s, sizeof(s)), strerror(errno));
    close(*fd);
    *fd = -1;
    return rc;
  }
  return 0;
}

int mk_sock_connect_poll(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLOUT};
  if (poll(&p, 1, 0) <= 0) return 0;
  int err = 0;
  socklen_t len = sizeof(err);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return -errno;
  return err ? -err : 1;
}

int mk_sock_accept(int listen_fd, int* fd) {
  *fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (*fd >= 0) {
    int one = 1;
    setsockopt(*fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return 0;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) return 0;
  MK_WARN("accept failed: %s", strerror(errno));
  return -errno;
}

int mk_sock_send_some(int fd, const void* buf, size_t len, size_t* off) {
  while (*off < len) {
    ssize_t n = send(fd, (const char*)buf + *off, len - *off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) { *off += (size_t)n; continue; }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    return errno == EPIPE ? -ECONNRESET : -errno;
  }
  return 1;
}

int mk_sock_recv_some(int fd, void* buf, size_t len, size_t* off) {
  while (*off < len) {
    ssize_t n = recv(fd, (char*)buf + *off, len - *off, MSG_DONTWAIT);
    if (n > 0) { *off += (size_t)n; continue; }
    if (n == 0) return -ECONNRESET;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    return -errno;
  }
  return 1;
}

static int xfer_all(int fd, void* buf, size_t len, int timeout_ms, int sending) {
  size_t off = 0;
  const uint64_t t0 = mk_now_ns();
  for (;;) {
    int rc = sending ? mk_sock_send_some(fd, buf, len, &off) : mk_sock_recv_some(fd, buf, len, &off);
    if (rc != 0) return rc < 0 ? rc : 0;
    const long left = timeout_ms - (long)((mk_now_ns() - t0) / 1000000);
    if (left <= 0) return -ETIMEDOUT;
    struct pollfd p = {.fd = fd, .events = sending ? POLLOUT : POLLIN};
    poll(&p, 1, (int)left);
  }
}

int mk_sock_send_all(int fd, const void* buf, size_t len, int timeout_ms) {
  return xfer_all(fd, (void*)buf, len, timeout_ms, 1);
}

int mk_sock_recv_all(int fd, void* buf, size_t len, int timeout_ms) {
  return xfer_all(fd, buf, len, timeout_ms, 0);
}

enum mk_peer_state mk_sock_peer_state(int fd) {
  char c;
  ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 1) return c == MK_SOCK_BYE ? MK_PEER_BYE : MK_PEER_ALIVE;
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return MK_PEER_ALIVE;
  return MK_PEER_DEAD;
}

void mk_sock_close_graceful(int fd) {
  if (fd < 0) return;
  char c = MK_SOCK_BYE;
  (void)send(fd, &c, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  close(fd);
}
