package io.stratalog.spark;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.Serializable;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.MessageDigest;
import java.security.PrivateKey;
import java.security.SecureRandom;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.crypto.Mac;
import javax.crypto.SecretKeyFactory;
import javax.crypto.spec.PBEKeySpec;
import javax.crypto.spec.SecretKeySpec;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.SSLSocket;
import javax.net.ssl.TrustManagerFactory;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * How the connector reaches a secured listener: TLS and SASL (PLAIN, SCRAM-SHA-256,
 * SCRAM-SHA-512), from the same {@code kafka.*} options Spark's Kafka source takes, read as the
 * Python client's {@code client/security.py} reads them: {@code security.protocol}; PEM files
 * for {@code ssl.truststore.location} and, for mutual TLS, {@code ssl.keystore.location} (key
 * and chain; an unencrypted PKCS#8 key); host names checked unless
 * {@code ssl.endpoint.identification.algorithm} is empty; {@code sasl.mechanism} with the user
 * from {@code sasl.jaas.config}. A setting that cannot work is refused by name at planning.
 */
final class WireSecurity implements Serializable {
  private static final long serialVersionUID = 1L;
  static final WireSecurity PLAINTEXT = new WireSecurity();
  private static final Pattern JAAS_OPTION = Pattern.compile("(\\w+)\\s*=\\s*\"((?:[^\"\\\\]|\\\\.)*)\"");
  private static final short SASL_HANDSHAKE = 17;
  private static final short SASL_AUTHENTICATE = 36;

  final String protocol;
  private final String truststore;
  private final String keystore;
  private final boolean checkHostname;
  final String mechanism;
  private final String username;
  private final String password;

  private WireSecurity() {
    protocol = "PLAINTEXT";
    truststore = keystore = mechanism = username = password = null;
    checkHostname = true;
  }

  private WireSecurity(CaseInsensitiveStringMap o) {
    protocol = o.getOrDefault("kafka.security.protocol", "PLAINTEXT").trim()
        .toUpperCase(Locale.ROOT);
    if (!List.of("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL").contains(protocol)) {
      throw refused("security.protocol must be one of PLAINTEXT, SSL, SASL_PLAINTEXT, "
          + "SASL_SSL, not '" + protocol + "'");
    }
    for (String s : new String[] {"ssl.truststore.type", "ssl.keystore.type"}) {
      String kind = o.get("kafka." + s);
      if (kind != null && !kind.equalsIgnoreCase("PEM")) {
        throw refused(s + ": only PEM files are read, not " + kind);
      }
    }
    truststore = o.get("kafka.ssl.truststore.location");
    keystore = o.get("kafka.ssl.keystore.location");
    if (o.get("kafka.ssl.key.password") != null) {
      throw refused("ssl.key.password: the JVM connector reads unencrypted keys only; use "
          + "format(\"stratalog-python\") for an encrypted one");
    }
    checkHostname = !"".equals(o.get("kafka.ssl.endpoint.identification.algorithm"));
    if (protocol.startsWith("SASL")) {
      mechanism = o.getOrDefault("kafka.sasl.mechanism", "GSSAPI").trim()
          .toUpperCase(Locale.ROOT);
      if (!List.of("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512").contains(mechanism)) {
        throw refused("sasl.mechanism " + mechanism + " is not offered by this client: use one "
            + "of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512");
      }
      Map<String, String> jaas = new HashMap<>();
      Matcher m = JAAS_OPTION.matcher(o.getOrDefault("kafka.sasl.jaas.config", ""));
      while (m.find()) {
        jaas.put(m.group(1), m.group(2).replace("\\\"", "\""));
      }
      username = jaas.get("username");
      password = jaas.get("password");
      if (username == null || password == null) {
        throw refused("sasl.jaas.config: " + protocol + " needs a user name and password "
            + "(username=\"...\" password=\"...\" in it)");
      }
    } else {
      mechanism = username = password = null;
    }
  }

  static WireSecurity of(CaseInsensitiveStringMap o) {
    return new WireSecurity(o);
  }

  /** TLS that cannot be set up: no other broker or later attempt would do better. */
  static final class Refused extends IOException {
    private static final long serialVersionUID = 1L;

    Refused(String message, Throwable cause) {
      super(message, cause);
    }
  }

  private static IllegalArgumentException refused(String why) {
    return new IllegalArgumentException("Kafka option kafka." + why);
  }

  boolean tls() {
    return protocol.equals("SSL") || protocol.equals("SASL_SSL");
  }

  boolean sasl() {
    return protocol.startsWith("SASL");
  }

  /** A connected socket to {@code host:port}: plain, or TLS with its handshake done. */
  Socket connect(String host, int port, int timeoutMs) throws IOException {
    Socket plain = new Socket();
    plain.setTcpNoDelay(true);
    plain.setReceiveBufferSize(4 << 20);
    plain.connect(new InetSocketAddress(host, port), timeoutMs);
    plain.setSoTimeout(timeoutMs);
    if (!tls()) {
      return plain;
    }
    try {
      SSLSocket s = (SSLSocket) context().getSocketFactory()
          .createSocket(plain, host, port, true);
      SSLParameters params = s.getSSLParameters();
      if (checkHostname) {
        params.setEndpointIdentificationAlgorithm("HTTPS");
      }
      s.setSSLParameters(params);
      s.startHandshake();
      return s;
    } catch (GeneralSecurityException | IOException e) {
      plain.close();
      throw new Refused("TLS with the broker at " + host + ":" + port + " failed: "
          + e.getMessage(), e);
    }
  }

  private SSLContext context() throws GeneralSecurityException, IOException {
    TrustManagerFactory tmf = null;
    if (truststore != null) {
      KeyStore trust = KeyStore.getInstance(KeyStore.getDefaultType());
      trust.load(null, null);
      int i = 0;
      for (Certificate c : certificates(pem(truststore, "ssl.truststore.location"))) {
        trust.setCertificateEntry("ca" + i++, c);
      }
      tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
      tmf.init(trust);
    }
    KeyManagerFactory kmf = null;
    if (keystore != null) {
      String text = pem(keystore, "ssl.keystore.location");
      if (text.contains("BEGIN ENCRYPTED PRIVATE KEY")) {
        throw new IOException("ssl.keystore.location: the key in " + keystore + " is encrypted;"
            + " the JVM connector reads unencrypted keys only");
      }
      KeyStore keys = KeyStore.getInstance(KeyStore.getDefaultType());
      keys.load(null, null);
      char[] none = new char[0];
      keys.setKeyEntry("client", privateKey(text), none,
          certificates(text).toArray(new Certificate[0]));
      kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
      kmf.init(keys, none);
    }
    SSLContext ctx = SSLContext.getInstance("TLS");
    ctx.init(kmf == null ? null : kmf.getKeyManagers(),
        tmf == null ? null : tmf.getTrustManagers(), null);
    return ctx;
  }

  private static String pem(String path, String setting) throws IOException {
    try {
      return new String(Files.readAllBytes(Paths.get(path)), StandardCharsets.US_ASCII);
    } catch (IOException e) {
      throw new IOException(setting + ": cannot read " + path + ": " + e, e);
    }
  }

  private static List<Certificate> certificates(String text) throws GeneralSecurityException {
    CertificateFactory cf = CertificateFactory.getInstance("X.509");
    List<Certificate> out = new ArrayList<>();
    for (byte[] der : blocks(text, "CERTIFICATE")) {
      out.add(cf.generateCertificate(new ByteArrayInputStream(der)));
    }
    return out;
  }

  private static PrivateKey privateKey(String text) throws GeneralSecurityException {
    List<byte[]> keys = blocks(text, "PRIVATE KEY");
    if (keys.isEmpty()) {
      throw new GeneralSecurityException("no PKCS#8 private key (BEGIN PRIVATE KEY) in the "
          + "keystore file");
    }
    GeneralSecurityException last = null;
    for (String algorithm : new String[] {"RSA", "EC"}) {
      try {
        return KeyFactory.getInstance(algorithm)
            .generatePrivate(new PKCS8EncodedKeySpec(keys.get(0)));
      } catch (GeneralSecurityException e) {
        last = e;
      }
    }
    throw last;
  }

  private static List<byte[]> blocks(String text, String label) {
    List<byte[]> out = new ArrayList<>();
    String begin = "-----BEGIN " + label + "-----";
    String end = "-----END " + label + "-----";
    for (int at = text.indexOf(begin); at >= 0; at = text.indexOf(begin, at + 1)) {
      int stop = text.indexOf(end, at);
      if (stop < 0) {
        break;
      }
      String body = text.substring(at + begin.length(), stop).replaceAll("\\s", "");
      out.add(Base64.getDecoder().decode(body));
    }
    return out;
  }

  // -- SASL ------------------------------------------------------------------------------------

  /** One SASL request on the connection being set up; returns the answer's body buffer. */
  interface Exchange {
    java.nio.ByteBuffer call(short api, short version, byte[] body) throws IOException;
  }

  /** The SASL handshake and exchange (SaslHandshake v1, SaslAuthenticate v1). */
  void authenticate(Exchange ex, String address) throws IOException {
    java.nio.ByteBuffer hs = ex.call(SASL_HANDSHAKE, (short) 1, string(mechanism));
    short err = hs.getShort();
    if (err != 0) {
      List<String> offered = new ArrayList<>();
      for (int n = hs.getInt(); n > 0; n--) {
        offered.add(readString(hs));
      }
      throw new KafkaWire.KafkaError("SASL mechanism " + mechanism + " refused by " + address
          + ": the listener offers " + (offered.isEmpty() ? "none" : String.join(", ", offered)),
          err);
    }
    if (mechanism.equals("PLAIN")) {
      step(ex, ("\0" + username + "\0" + password).getBytes(StandardCharsets.UTF_8), address);
      return;
    }
    try {
      scram(ex, address);
    } catch (GeneralSecurityException e) {
      throw new IOException("SCRAM: " + e.getMessage(), e);
    }
  }

  private byte[] step(Exchange ex, byte[] token, String address) throws IOException {
    java.io.ByteArrayOutputStream b = new java.io.ByteArrayOutputStream();
    java.io.DataOutputStream w = new java.io.DataOutputStream(b);
    w.writeInt(token.length);
    w.write(token);
    java.nio.ByteBuffer r = ex.call(SASL_AUTHENTICATE, (short) 1, b.toByteArray());
    short err = r.getShort();
    String message = readString(r);
    if (err != 0) {
      throw new KafkaWire.KafkaError("SASL authentication of '" + username + "' on " + address
          + " failed: " + message, err);
    }
    byte[] out = new byte[r.getInt()];
    r.get(out);
    return out;
  }

  private void scram(Exchange ex, String address) throws IOException, GeneralSecurityException {
    boolean sha512 = mechanism.endsWith("512");
    String hmacName = sha512 ? "HmacSHA512" : "HmacSHA256";
    byte[] nonceBytes = new byte[18];
    new SecureRandom().nextBytes(nonceBytes);
    String nonce = Base64.getUrlEncoder().withoutPadding().encodeToString(nonceBytes);
    String first = "n=" + username.replace("=", "=3D").replace(",", "=2C") + ",r=" + nonce;
    String serverFirst = new String(
        step(ex, ("n,," + first).getBytes(StandardCharsets.UTF_8), address),
        StandardCharsets.UTF_8);
    Map<String, String> f = new HashMap<>();
    for (String kv : serverFirst.split(",")) {
      int eq = kv.indexOf('=');
      if (eq > 0) {
        f.put(kv.substring(0, eq), kv.substring(eq + 1));
      }
    }
    String r = f.get("r");
    if (r == null || !r.startsWith(nonce) || f.get("s") == null || f.get("i") == null) {
      throw new IOException("the broker's SCRAM answer is not valid: " + serverFirst);
    }
    byte[] salt = Base64.getDecoder().decode(f.get("s"));
    int iterations = Integer.parseInt(f.get("i"));
    PBEKeySpec spec = new PBEKeySpec(password.toCharArray(), salt, iterations, sha512 ? 512 : 256);
    byte[] salted = SecretKeyFactory.getInstance("PBKDF2With" + hmacName)
        .generateSecret(spec).getEncoded();
    byte[] clientKey = hmac(hmacName, salted, "Client Key");
    byte[] storedKey = MessageDigest.getInstance(sha512 ? "SHA-512" : "SHA-256").digest(clientKey);
    String withoutProof = "c=biws,r=" + r;
    String authMessage = first + "," + serverFirst + "," + withoutProof;
    byte[] signature = hmac(hmacName, storedKey, authMessage);
    byte[] proof = new byte[clientKey.length];
    for (int i = 0; i < proof.length; i++) {
      proof[i] = (byte) (clientKey[i] ^ signature[i]);
    }
    String finalMessage = withoutProof + ",p=" + Base64.getEncoder().encodeToString(proof);
    String serverFinal = new String(
        step(ex, finalMessage.getBytes(StandardCharsets.UTF_8), address), StandardCharsets.UTF_8);
    String expected = "v=" + Base64.getEncoder().encodeToString(
        hmac(hmacName, hmac(hmacName, salted, "Server Key"), authMessage));
    if (!MessageDigest.isEqual(expected.getBytes(StandardCharsets.UTF_8),
        serverFinal.getBytes(StandardCharsets.UTF_8))) {
      throw new IOException("the broker's SCRAM signature is wrong: it does not know the "
          + "password");
    }
  }

  private static byte[] hmac(String name, byte[] key, byte[] data)
      throws GeneralSecurityException {
    Mac mac = Mac.getInstance(name);
    mac.init(new SecretKeySpec(key, name));
    return mac.doFinal(data);
  }

  private static byte[] hmac(String name, byte[] key, String data)
      throws GeneralSecurityException {
    return hmac(name, key, data.getBytes(StandardCharsets.UTF_8));
  }

  private static byte[] string(String s) {
    byte[] b = s.getBytes(StandardCharsets.UTF_8);
    byte[] out = new byte[2 + b.length];
    out[0] = (byte) (b.length >> 8);
    out[1] = (byte) b.length;
    System.arraycopy(b, 0, out, 2, b.length);
    return out;
  }

  private static String readString(java.nio.ByteBuffer bb) {
    short n = bb.getShort();
    if (n < 0) {
      return null;
    }
    byte[] b = new byte[n];
    bb.get(b);
    return new String(b, StandardCharsets.UTF_8);
  }
}
