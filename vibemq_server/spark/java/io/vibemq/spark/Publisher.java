/*
 * A small client of the native protocol (docs/protocol.md) for one writing task: Connect,
 * then Publish frames pipelined with at most maxInFlight awaiting their PublishAck (a reader
 * thread counts the replies), every PublishAck awaited by finish(). An Error reply, a
 * Disconnect, a lost connection or no PublishAck within the timeout fails the task.
 * The payload is sent as it is: the broker checks that it is UTF-8 JSON.
 */
package io.vibemq.spark;

import java.io.BufferedOutputStream;
import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.UUID;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;

final class Publisher implements AutoCloseable {
  static final String[] NO_HEADERS = new String[0];
  static final String CLIENT_VERSION = "vibemq-spark-jvm/1";
  private static final int VERSION = 1, CONNECT = 0, CONNECT_ACK = 1, DISCONNECT = 2;
  private static final int PUBLISH = 20, PUBLISH_ACK = 21, ERROR = 99;
  private static final int MAX_FRAME = 86 * 1024 * 1024;

  private final String where;
  private final Socket socket;
  private final OutputStream out;
  private final DataInputStream in;
  private final int maxInFlight;
  private final long timeoutMs;
  private final Semaphore room;
  private final String idPrefix = "spark_" + UUID.randomUUID().toString().substring(0, 8) + "-";
  private final ByteArrayOutputStream frame = new ByteArrayOutputStream(256);
  private long next;
  private volatile String failure;
  private Thread reader;

  Publisher(String host, int port, String token, int maxInFlight, long timeoutMs)
      throws IOException {
    this.where = host + ":" + port;
    this.maxInFlight = maxInFlight;
    this.timeoutMs = timeoutMs;
    this.room = new Semaphore(maxInFlight);
    socket = new Socket();
    try {
      socket.connect(new InetSocketAddress(host, port), (int) Math.min(timeoutMs, 30_000));
      socket.setTcpNoDelay(true);
      socket.setSoTimeout((int) Math.max(1, timeoutMs));
      out = new BufferedOutputStream(socket.getOutputStream(), 64 * 1024);
      in = new DataInputStream(socket.getInputStream());
      String[] headers =
          token == null
              ? new String[] {"clientVersion", CLIENT_VERSION}
              : new String[] {"clientVersion", CLIENT_VERSION, "authToken", token};
      send(CONNECT, idPrefix + "conn", null, new byte[0], headers);
      out.flush();
      while (true) {
        Reply r = read();
        if (r.type == CONNECT_ACK) break;
        if (r.type == ERROR) throw new IOException("VibeMQError " + r.describe());
        if (r.type == DISCONNECT) throw new IOException("connection closed by " + where);
      }
    } catch (IOException e) {
      socket.close();
      String msg = e.getMessage() == null ? e.toString() : e.getMessage();
      throw new IOException(
          msg.startsWith("VibeMQError") ? msg : "ConnectionFailed: cannot connect to " + where
              + ": " + msg, e);
    }
    socket.setSoTimeout(0); // the reader waits as long as publishes do; they time out
    reader = new Thread(this::readReplies, "vibemq-publisher-" + where);
    reader.setDaemon(true);
    reader.start();
  }

  void publish(String queue, byte[] payload, String[] headers, String priority)
      throws IOException {
    check();
    if (!room.tryAcquire()) {
      flush();
      waitFor(1);
    }
    if (priority != null) {
      String[] with = new String[headers.length + 2];
      int n = 0;
      for (int i = 0; i < headers.length; i += 2) {
        if (!"priority".equals(headers[i])) {
          with[n++] = headers[i];
          with[n++] = headers[i + 1];
        }
      }
      with[n++] = "priority";
      with[n++] = priority;
      headers = java.util.Arrays.copyOf(with, n);
    }
    try {
      send(PUBLISH, idPrefix + (next++), queue, payload, headers);
    } catch (IOException e) {
      throw lost(e);
    }
  }

  /** Flushes and waits for every PublishAck. */
  void finish() throws IOException {
    flush();
    waitFor(maxInFlight);
    room.release(maxInFlight);
    try {
      send(DISCONNECT, idPrefix + "disc", null, new byte[0], NO_HEADERS);
      out.flush();
    } catch (IOException e) {
      // every publish is acknowledged: a connection lost now loses nothing
    }
  }

  private void flush() throws IOException {
    try {
      out.flush();
    } catch (IOException e) {
      throw lost(e);
    }
  }

  private void waitFor(int permits) throws IOException {
    boolean got;
    try {
      got = room.tryAcquire(permits, timeoutMs, TimeUnit.MILLISECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IOException("interrupted while waiting for a PublishAck", e);
    }
    check();
    if (!got) {
      throw new IOException(
          "TimeoutError: no PublishAck from " + where + " within " + timeoutMs + " ms");
    }
  }

  private void check() throws IOException {
    String f = failure;
    if (f != null) throw new IOException(f);
  }

  private IOException lost(IOException e) {
    String f = failure;
    return new IOException(f != null ? f : "ConnectionLost: connection lost to " + where + ": "
        + e.getMessage(), e);
  }

  private void readReplies() {
    try {
      while (true) {
        Reply r = read();
        if (r.type == PUBLISH_ACK) {
          room.release();
        } else if (r.type == ERROR) {
          fail("VibeMQError " + r.describe() + " (publish " + r.id + " to " + where + ")");
          return;
        } else if (r.type == DISCONNECT) {
          fail("ConnectionLost: disconnected by " + where + " (" + r.reason + ")");
          return;
        }
      }
    } catch (IOException e) {
      fail("ConnectionLost: connection lost to " + where + ": " + e);
    }
  }

  private void fail(String why) {
    if (failure == null) failure = why;
    room.release(maxInFlight + 1); // wake a waiting publish: it sees the failure
  }

  // -- frames -----------------------------------------------------------------------------

  private void send(int type, String id, String queue, byte[] payload, String[] headers)
      throws IOException {
    frame.reset();
    frame.write(VERSION);
    frame.write(type);
    str16(id);
    str16(queue);
    u32(payload.length);
    frame.write(payload, 0, payload.length);
    int pairs = 0;
    for (int i = 0; i < headers.length; i += 2) {
      if (isSet(headers[i]) && isSet(headers[i + 1])) pairs++;
    }
    u16(pairs);
    for (int i = 0; i < headers.length; i += 2) {
      if (isSet(headers[i]) && isSet(headers[i + 1])) {
        str16(headers[i]);
        str16(headers[i + 1]);
      }
    }
    int n = frame.size();
    out.write(n >>> 24);
    out.write(n >>> 16);
    out.write(n >>> 8);
    out.write(n);
    frame.writeTo(out);
  }

  private static boolean isSet(String s) {
    return s != null && !s.isEmpty();
  }

  private void str16(String s) throws IOException {
    byte[] b = s == null ? new byte[0] : s.getBytes(StandardCharsets.UTF_8);
    if (b.length > 0xFFFF) throw new IllegalArgumentException("a field over 65535 bytes: " + s);
    u16(b.length);
    frame.write(b, 0, b.length);
  }

  private void u16(int v) {
    frame.write(v >>> 8);
    frame.write(v);
  }

  private void u32(int v) {
    frame.write(v >>> 24);
    frame.write(v >>> 16);
    frame.write(v >>> 8);
    frame.write(v);
  }

  private record Reply(int type, String id, String code, String message, String reason) {
    String describe() {
      return code + ": " + message;
    }
  }

  private Reply read() throws IOException {
    int len;
    try {
      len = in.readInt();
    } catch (EOFException e) {
      throw new EOFException("the broker closed the connection");
    }
    if (len < 2 || len > MAX_FRAME) throw new IOException("bad frame length " + len);
    byte[] b = new byte[len];
    in.readFully(b);
    int[] at = {2};
    int type = b[1] & 0xFF;
    String id = text(b, at, 2);
    text(b, at, 2); // queue
    text(b, at, 4); // payload
    int count = at[0] + 2 <= len ? Segments.be16(b, at[0]) : 0;
    at[0] += 2;
    String reason = null;
    for (int i = 0; i < count && at[0] < len; i++) {
      String k = text(b, at, 2), v = text(b, at, 2);
      if ("reason".equals(k)) reason = v;
    }
    String code = at[0] < len ? text(b, at, 2) : null;
    String message = at[0] < len ? text(b, at, 2) : null;
    return new Reply(type, id, code, message, reason);
  }

  private static String text(byte[] b, int[] at, int width) {
    if (at[0] + width > b.length) return null;
    long n = width == 2 ? Segments.be16(b, at[0]) : Segments.be32(b, at[0]);
    at[0] += width;
    int end = (int) Math.min(b.length, at[0] + n);
    String s = new String(b, at[0], end - at[0], StandardCharsets.UTF_8);
    at[0] = end;
    return s;
  }

  @Override
  public void close() throws IOException {
    socket.close();
    if (reader != null) {
      try {
        reader.join(5000);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }
  }
}
