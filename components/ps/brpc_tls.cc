// Mutual TLS inside Paddle 2.6.2's brpc, preloaded into a PS role (LD_PRELOAD; components/ps/brpc_tls.py).
//
// Paddle's PS builds its brpc servers and channels with no SSL options, though the brpc inside libpaddle.so (1.4.0,
// with OpenSSL 1.1.1) has them. libpaddle.so calls these brpc functions through its PLT, so a library loaded first
// can stand in for them: each sets the SSL options and calls libpaddle's own.
//
// * Server::StartInternal (every Server::Start): the role's certificate and key, client certificates required and
//   verified against the job's CA alone.
// * Channel::InitChannelOptions (every Channel::Init): the same certificate as a client, the server's verified.
// * Create{Client,Server}SSLContext: TLS 1.2 exactly. brpc 1.4 takes OpenSSL 1.1.1's TLS 1.3 post-handshake
//   messages for a renegotiation and closes the connection.
// * DetectSSLState: a server with SSL options still takes plaintext connections in brpc 1.4 (force_ssl came in
//   1.6); a connection whose first bytes are not TLS is failed as force_ssl does.
// * IOBuf::cut_multiple_into_SSL_channel, IOPortal::append_from_SSL_channel: brpc 1.4 reads and writes one SSL
//   session from two threads at once, which OpenSSL does not allow. Each call holds a lock of its session, as
//   brpc 1.6 does (apache/brpc#2180).
// * ... and a write finishes its flush: brpc 1.4 writes through a buffering BIO and flushes it once; a flush that
//   meets a full socket leaves the end of the message in the buffer until the next write, which may never come (a
//   PS job's dense pull waited forever for its reply's end). brpc 1.15 dropped the buffer instead, but unbuffered
//   each record is a system call and a packet of its own: the compose job ran at 0.75-0.82x its speed without
//   TLS that way, 0.83-1.03x (median 0.90x) with the buffer kept and its flush finished here
//   (bench/results/tls.md). The flush waits for the socket as long as the peer takes to read, up to
//   kFlushTimeoutMs, then fails the connection (brpc retries the call on a new one).
//
// The structs below are brpc 1.4.0's (src/brpc/ssl_options.h). The options are created by libpaddle's own
// constructors; their defaults are checked before anything is written, and a mismatch aborts the role with a line
// saying so. libpaddle.so is loaded by Python with RTLD_LOCAL, so its functions are looked up in it by handle.
#include <dlfcn.h>
#include <link.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <poll.h>
#include <string>
#include <sys/types.h>
#include <vector>

struct ssl_ctx_st;
struct ssl_st;
namespace butil {
struct EndPoint;
class IOBuf {
 public:
  static ssize_t cut_multiple_into_SSL_channel(ssl_st* ssl, IOBuf* const* pieces, size_t count, int* ssl_error);
};
class IOPortal {
 public:
  ssize_t append_from_SSL_channel(ssl_st* ssl, int* ssl_error, size_t max_count);
};
}  // namespace butil

namespace brpc {
struct PortRange;
class ServerOptions;
class ChannelOptions;
struct CertInfo {
  std::string certificate;
  std::string private_key;
  std::vector<std::string> sni_filters;
};
struct VerifyOptions {
  int verify_depth;
  std::string ca_file_path;
};
struct ChannelSSLOptions {
  std::string ciphers;
  std::string protocols;
  std::string sni_name;
  CertInfo client_cert;
  VerifyOptions verify;
};
struct ServerSSLOptions {
  CertInfo default_cert;
  std::vector<CertInfo> certs;
  bool strict_sni;
  bool disable_ssl3;
  bool release_buffer;
  int session_lifetime_s;
  int session_cache_size;
  std::string ciphers;
  std::string ecdhe_curve_name;
  VerifyOptions verify;
};
// The sizes libpaddle.so allocates (operator new in ServerOptions::mutable_ssl_options) and copies.
static_assert(sizeof(ServerSSLOptions) == 0xe8, "brpc 1.4.0's ServerSSLOptions");
static_assert(sizeof(ChannelSSLOptions) == 0xe0, "brpc 1.4.0's ChannelSSLOptions");

class Server {
 public:
  int StartInternal(const butil::EndPoint& endpoint, const PortRange& ports, const ServerOptions* options);
};
class Channel {
 public:
  int InitChannelOptions(const ChannelOptions* options);
};
enum SSLState { SSL_UNKNOWN = 0, SSL_OFF = 1 };
SSLState DetectSSLState(int fd, int* error_code);
ssl_ctx_st* CreateClientSSLContext(const ChannelSSLOptions& options);
ssl_ctx_st* CreateServerSSLContext(const std::string& certificate, const std::string& private_key,
                                   const ServerSSLOptions& options, std::vector<std::string>* hostnames);
}  // namespace brpc

namespace {

const char kPemEnv[] = "CTR_PS_TLS_PEM";  // the role's certificate and key, one PEM file
const char kCaEnv[] = "CTR_PS_TLS_CA";    // the job's CA certificate
// ECDHE with AES-GCM only (the job's keys are P-256): AEAD suites exist in TLS 1.2 and later only.
const char kCiphers[] = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384";
const long kTls12 = 0x0303;
const int kSetMinProto = 123, kSetMaxProto = 124;  // SSL_CTRL_SET_{MIN,MAX}_PROTO_VERSION
const int kBioFlush = 11, kBioWpending = 13;  // BIO_CTRL_FLUSH, BIO_CTRL_WPENDING
const int kSslErrorNone = 0, kSslErrorSyscall = 5;  // SSL_ERROR_NONE, SSL_ERROR_SYSCALL
const int kFlushTimeoutMs = 30000, kFlushPollMs = 100;

[[noreturn]] void die(const std::string& what) {
  fprintf(stderr, "error: ps.tls (components/ps/brpc_tls.cc): %s\n", what.c_str());
  fflush(stderr);
  abort();
}

std::string env(const char* name) {
  const char* value = getenv(name);
  if (value == nullptr || *value == '\0') die(std::string(name) + " is not set; the role's launcher sets it");
  return value;
}

int find_paddle(struct dl_phdr_info* info, size_t, void* out) {
  static const char kName[] = "/libpaddle.so";
  const size_t n = strlen(info->dlpi_name), k = sizeof(kName) - 1;
  if (n < k || strcmp(info->dlpi_name + n - k, kName) != 0) return 0;
  *static_cast<std::string*>(out) = info->dlpi_name;
  return 1;
}

template <class F>
F paddle_symbol(const char* name) {
  std::string path;
  dl_iterate_phdr(find_paddle, &path);
  void* lib = path.empty() ? nullptr : dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  void* symbol = lib == nullptr ? nullptr : dlsym(lib, name);
  if (symbol == nullptr) die(std::string("libpaddle.so has no ") + name + "; paddlepaddle==2.6.2 is required");
  return reinterpret_cast<F>(symbol);
}

ssl_ctx_st* tls12_only(ssl_ctx_st* ctx) {
  using Ctrl = long (*)(ssl_ctx_st*, int, long, void*);
  static const Ctrl ctrl = paddle_symbol<Ctrl>("SSL_CTX_ctrl");
  if (ctx == nullptr) return ctx;  // brpc logs why and fails the server or channel
  if (ctrl(ctx, kSetMinProto, kTls12, nullptr) != 1 || ctrl(ctx, kSetMaxProto, kTls12, nullptr) != 1)
    die("OpenSSL refused TLS 1.2 as the only version");
  return ctx;
}

// One lock per SSL session, striped: a session's reads and writes never overlap; two sessions rarely share a lock.
std::mutex& session_lock(const ssl_st* ssl) {
  static std::mutex locks[1024];
  return locks[(reinterpret_cast<uintptr_t>(ssl) >> 4) % 1024];
}

void set_verify(brpc::VerifyOptions* verify) {
  verify->verify_depth = 1;  // role certificates are signed by the job's CA itself
  verify->ca_file_path = env(kCaEnv);
}

}  // namespace

int brpc::Server::StartInternal(const butil::EndPoint& endpoint, const PortRange& ports,
                                const ServerOptions* options) {
  using Start = int (*)(Server*, const butil::EndPoint&, const PortRange&, const ServerOptions*);
  using MutableSsl = ServerSSLOptions* (*)(ServerOptions*);
  static const Start start =
      paddle_symbol<Start>("_ZN4brpc6Server13StartInternalERKN5butil8EndPointERKNS_9PortRangeEPKNS_13ServerOptionsE");
  static const MutableSsl mutable_ssl = paddle_symbol<MutableSsl>("_ZN4brpc13ServerOptions19mutable_ssl_optionsEv");
  if (options == nullptr) die("a brpc server started without options cannot be given TLS");
  ServerSSLOptions* ssl = mutable_ssl(const_cast<ServerOptions*>(options));
  if (ssl->session_lifetime_s != 300 || ssl->session_cache_size != 20480 || ssl->ecdhe_curve_name != "prime256v1")
    die("brpc's ServerSSLOptions are not brpc 1.4.0's; paddlepaddle==2.6.2 is required");
  ssl->default_cert.certificate = ssl->default_cert.private_key = env(kPemEnv);
  ssl->ciphers = kCiphers;
  set_verify(&ssl->verify);
  return start(this, endpoint, ports, options);
}

int brpc::Channel::InitChannelOptions(const ChannelOptions* options) {
  using Init = int (*)(Channel*, const ChannelOptions*);
  using MutableSsl = ChannelSSLOptions* (*)(ChannelOptions*);
  static const Init init = paddle_symbol<Init>("_ZN4brpc7Channel18InitChannelOptionsEPKNS_14ChannelOptionsE");
  static const MutableSsl mutable_ssl = paddle_symbol<MutableSsl>("_ZN4brpc14ChannelOptions19mutable_ssl_optionsEv");
  if (options == nullptr) die("a brpc channel initialised without options cannot be given TLS");
  ChannelSSLOptions* ssl = mutable_ssl(const_cast<ChannelOptions*>(options));
  if (ssl->protocols.compare(0, 5, "TLSv1") != 0)
    die("brpc's ChannelSSLOptions are not brpc 1.4.0's; paddlepaddle==2.6.2 is required");
  ssl->client_cert.certificate = ssl->client_cert.private_key = env(kPemEnv);
  ssl->ciphers = kCiphers;
  set_verify(&ssl->verify);
  return init(this, options);
}

ssl_ctx_st* brpc::CreateClientSSLContext(const ChannelSSLOptions& options) {
  using Create = ssl_ctx_st* (*)(const ChannelSSLOptions&);
  static const Create create = paddle_symbol<Create>("_ZN4brpc22CreateClientSSLContextERKNS_17ChannelSSLOptionsE");
  return tls12_only(create(options));
}

ssl_ctx_st* brpc::CreateServerSSLContext(const std::string& certificate, const std::string& private_key,
                                         const ServerSSLOptions& options, std::vector<std::string>* hostnames) {
  using Create = ssl_ctx_st* (*)(const std::string&, const std::string&, const ServerSSLOptions&,
                                 std::vector<std::string>*);
  static const Create create = paddle_symbol<Create>(
      "_ZN4brpc22CreateServerSSLContextERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEES7_"
      "RKNS_16ServerSSLOptionsEPSt6vectorIS5_SaIS5_EE");
  return tls12_only(create(certificate, private_key, options, hostnames));
}

brpc::SSLState brpc::DetectSSLState(int fd, int* error_code) {
  using Detect = SSLState (*)(int, int*);
  static const Detect detect = paddle_symbol<Detect>("_ZN4brpc14DetectSSLStateEiPi");
  const SSLState state = detect(fd, error_code);
  if (state != SSL_OFF) return state;
  *error_code = EPROTO;  // DoRead fails the socket with this errno
  return SSL_UNKNOWN;
}

ssize_t butil::IOBuf::cut_multiple_into_SSL_channel(ssl_st* ssl, IOBuf* const* pieces, size_t count, int* ssl_error) {
  using Cut = ssize_t (*)(ssl_st*, IOBuf* const*, size_t, int*);
  using GetBio = void* (*)(const ssl_st*);
  using GetFd = int (*)(const ssl_st*);
  using BioCtrl = long (*)(void*, int, long, void*);
  static const Cut cut = paddle_symbol<Cut>("_ZN5butil5IOBuf29cut_multiple_into_SSL_channelEP6ssl_stPKPS0_mPi");
  static const GetBio get_wbio = paddle_symbol<GetBio>("SSL_get_wbio");
  static const GetFd get_fd = paddle_symbol<GetFd>("SSL_get_wfd");
  static const BioCtrl bio_ctrl = paddle_symbol<BioCtrl>("BIO_ctrl");
  std::lock_guard<std::mutex> hold(session_lock(ssl));
  const ssize_t written = cut(ssl, pieces, count, ssl_error);
  // An error, or a write the socket took only in part: brpc calls again (the unwritten rest is still its data).
  if (written < 0 || *ssl_error != kSslErrorNone) return written;
  // Every byte was taken, so brpc will not call again for it: what the buffer still holds must reach the socket.
  void* wbio = get_wbio(ssl);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kFlushTimeoutMs);
  while (bio_ctrl(wbio, kBioWpending, 0, nullptr) > 0) {
    if (bio_ctrl(wbio, kBioFlush, 0, nullptr) > 0) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      *ssl_error = kSslErrorSyscall;
      return -1;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      errno = ETIMEDOUT;
      *ssl_error = kSslErrorSyscall;
      return -1;
    }
    struct pollfd socket = {get_fd(ssl), POLLOUT, 0};
    poll(&socket, 1, kFlushPollMs);
  }
  return written;
}

ssize_t butil::IOPortal::append_from_SSL_channel(ssl_st* ssl, int* ssl_error, size_t max_count) {
  using Append = ssize_t (*)(IOPortal*, ssl_st*, int*, size_t);
  static const Append append = paddle_symbol<Append>("_ZN5butil8IOPortal23append_from_SSL_channelEP6ssl_stPim");
  std::lock_guard<std::mutex> hold(session_lock(ssl));
  return append(this, ssl, ssl_error, max_count);
}
