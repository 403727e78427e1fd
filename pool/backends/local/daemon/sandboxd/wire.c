/* Packets, replies, status records, and small helpers shared by every process. */
#include "sandboxd.h"

int user_mode;
int control_fd = 3;
static char *title_start;
static size_t title_len;

msg_t *msg_new(void) {
    msg_t *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->raw = malloc(MAX_MSG + 1);
    m->buf = malloc(MAX_MSG + 1);
    if (!m->raw || !m->buf) return NULL;
    return m;
}

/* Split a packet into header and key=value fields, in m->buf. */
int parse_msg(msg_t *m, const char *raw, size_t n) {
    if (n < HDR_SIZE) return -1;
    memcpy(m->buf, raw, n);
    uint32_t h[4];
    memcpy(h, m->buf, sizeof h);
    m->op = h[0];
    m->sbx = h[1];
    m->seq = h[2];
    m->nfields = h[3];
    if (m->nfields > MAX_FIELDS) return -1;
    size_t off = HDR_SIZE;
    for (uint32_t i = 0; i < m->nfields; i++) {
        uint32_t len;
        if (off + 4 > n) return -1;
        memcpy(&len, m->buf + off, 4);
        if (len > n - off - 4) return -1;
        /* NUL-terminate in place by shifting the field over its length prefix. */
        memmove(m->buf + off, m->buf + off + 4, len);
        m->buf[off + len] = 0;
        char *f = m->buf + off;
        char *eq = strchr(f, '=');
        if (eq) { *eq = 0; m->key[i] = f; m->val[i] = eq + 1; }
        else { m->key[i] = f; m->val[i] = f + strlen(f); }
        off += 4 + len;
    }
    return 0;
}

int recv_msg(int fd, msg_t *m) {
    struct iovec iov = {m->raw, MAX_MSG};
    char cbuf[CMSG_SPACE(sizeof(int) * MAX_FDS)];
    struct msghdr mh = {0};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf;
    mh.msg_controllen = sizeof cbuf;
    ssize_t n;
    do n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC); while (n < 0 && errno == EINTR);
    if (n <= 0) return -1;
    m->nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        int k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (int i = 0; i < k && m->nfds < MAX_FDS; i++) m->fds[m->nfds++] = ((int *)CMSG_DATA(c))[i];
    }
    m->rawlen = (size_t)n;
    if (parse_msg(m, m->raw, m->rawlen) < 0) {
        close_fds(m);
        m->op = 0;
    }
    return 0;
}

int send_raw(int fd, const char *buf, size_t len, const int *fds, int nfds) {
    struct iovec iov = {(void *)buf, len};
    char cbuf[CMSG_SPACE(sizeof(int) * MAX_FDS)];
    struct msghdr mh = {0};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    if (nfds > 0) {
        memset(cbuf, 0, sizeof cbuf);
        mh.msg_control = cbuf;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    }
    ssize_t n;
    do n = sendmsg(fd, &mh, MSG_NOSIGNAL); while (n < 0 && errno == EINTR);
    return n < 0 ? -1 : 0;
}

/* Pass a request on unchanged, with its fds; our copies of the fds are closed. */
int forward_msg(int fd, msg_t *m) {
    int rc = send_raw(fd, m->raw, m->rawlen, m->fds, m->nfds);
    close_fds(m);
    return rc;
}

/* A reply packet; the text holds ";"-free "key=value" fields separated by "\n". */
void reply(uint32_t op, uint32_t sbx, uint32_t seq, const char *fmt, ...) {
    char text[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    uint32_t len = strlen(text);
    char buf[8192 + HDR_SIZE + 4];
    uint32_t h[4] = {op, sbx, seq, 1};
    memcpy(buf, h, HDR_SIZE);
    memcpy(buf + HDR_SIZE, &len, 4);
    memcpy(buf + HDR_SIZE + 4, text, len);
    send_raw(control_fd, buf, HDR_SIZE + 4 + len, NULL, 0);
}

void close_fds(msg_t *m) {
    for (int i = 0; i < m->nfds; i++) close(m->fds[i]);
    m->nfds = 0;
}

void write_status(int fd, int code, int timed_out, int err) {
    int32_t rec[4] = {code, timed_out, err, 0};
    ssize_t n;
    do n = write(fd, rec, sizeof rec); while (n < 0 && errno == EINTR);
}

const char *field(msg_t *m, const char *key) {
    for (uint32_t i = 0; i < m->nfields; i++)
        if (strcmp(m->key[i], key) == 0) return m->val[i];
    return NULL;
}

/* Every value of a repeated field, in order; returns how many. */
int fields_of(msg_t *m, const char *key, char **out, int max) {
    int n = 0;
    for (uint32_t i = 0; i < m->nfields && n < max; i++)
        if (strcmp(m->key[i], key) == 0) out[n++] = m->val[i];
    return n;
}

int write_str_closing(int fd, const char *text) {
    if (fd < 0) return -1;
    ssize_t n = write(fd, text, strlen(text));
    int saved = errno;
    close(fd);
    errno = saved;
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

/* "what: the errno's message" into err; returns -1, for `return errno_fail(...)`. */
int errno_fail(char *err, size_t errlen, const char *what) {
    snprintf(err, errlen, "%s: %s", what, strerror(errno));
    return -1;
}

int write_file_str(const char *path, const char *text) {
    return write_str_closing(open(path, O_WRONLY | O_CLOEXEC), text);
}

int read_full(int fd, void *buf, size_t len) {
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        got += n;
    }
    return 0;
}

/* Read until end of file or len bytes; the count, or -1. */
ssize_t read_all(int fd, void *buf, size_t len) {
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -1;
        if (n == 0) break;
        got += n;
    }
    return (ssize_t)got;
}

long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

int mkdir_p(const char *path, mode_t mode) {
    if (mkdir(path, mode) == 0 || errno == EEXIST) return 0; /* the usual case: its parent is there */
    if (errno != ENOENT) return -1;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, mode) < 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(tmp, mode) < 0 && errno != EEXIST) return -1;
    return 0;
}

void set_title_area(char *start, size_t len) {
    title_start = start;
    title_len = len;
}

/* Processes in a sandbox are forks of the daemon; give them a neutral command
 * line so /proc/N/cmdline in the sandbox shows no host paths. */
void set_title(const char *title) {
    if (!title_start) return;
    memset(title_start, 0, title_len);
    snprintf(title_start, title_len, "%s", title);
}
