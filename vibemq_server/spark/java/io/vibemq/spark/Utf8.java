/* Strict UTF-8 as Python's bytes.decode() accepts it, and its replacing decode. */
package io.vibemq.spark;

final class Utf8 {
  private Utf8() {}

  /** No overlongs, no surrogates, at most U+10FFFF, no truncated sequence. */
  static boolean valid(byte[] s, int off, int len) {
    int i = off, n = off + len;
    while (i < n) {
      int c = s[i] & 0xFF;
      if (c < 0x80) {
        i++;
        continue;
      }
      if (c >= 0xC2 && c <= 0xDF) {
        if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) return false;
        i += 2;
      } else if (c >= 0xE0 && c <= 0xEF) {
        if (i + 2 >= n) return false;
        int c1 = s[i + 1] & 0xFF;
        if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80) return false;
        if (c == 0xE0 && c1 < 0xA0) return false; // overlong
        if (c == 0xED && c1 > 0x9F) return false; // surrogate
        i += 3;
      } else if (c >= 0xF0 && c <= 0xF4) {
        if (i + 3 >= n) return false;
        int c1 = s[i + 1] & 0xFF;
        if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 || (s[i + 3] & 0xC0) != 0x80) {
          return false;
        }
        if (c == 0xF0 && c1 < 0x90) return false; // overlong
        if (c == 0xF4 && c1 > 0x8F) return false; // above U+10FFFF
        i += 4;
      } else {
        return false;
      }
    }
    return true;
  }

  private static final byte[] REPLACEMENT = {(byte) 0xEF, (byte) 0xBF, (byte) 0xBD};

  private static boolean in(byte[] s, int i, int n, int lo, int hi) {
    return i < n && (s[i] & 0xFF) >= lo && (s[i] & 0xFF) <= hi;
  }

  /**
   * UTF-8 of the text with each maximal invalid subpart replaced by U+FFFD, as Python's
   * bytes.decode(errors="replace") does (Java's decoder differs: one U+FFFD for a surrogate).
   */
  static byte[] replaceInvalid(byte[] s, int off, int len) {
    java.io.ByteArrayOutputStream out = new java.io.ByteArrayOutputStream(len + 16);
    int i = off, n = off + len;
    while (i < n) {
      int c = s[i] & 0xFF;
      int good; // length of a valid sequence at i, or -(length of the invalid subpart)
      if (c < 0x80) {
        good = 1;
      } else if (c >= 0xC2 && c <= 0xDF) {
        good = in(s, i + 1, n, 0x80, 0xBF) ? 2 : -1;
      } else if (c >= 0xE0 && c <= 0xEF) {
        int lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        if (!in(s, i + 1, n, lo, hi)) good = -1;
        else good = in(s, i + 2, n, 0x80, 0xBF) ? 3 : -2;
      } else if (c >= 0xF0 && c <= 0xF4) {
        int lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        if (!in(s, i + 1, n, lo, hi)) good = -1;
        else if (!in(s, i + 2, n, 0x80, 0xBF)) good = -2;
        else good = in(s, i + 3, n, 0x80, 0xBF) ? 4 : -3;
      } else {
        good = -1;
      }
      if (good > 0) {
        out.write(s, i, good);
        i += good;
      } else {
        out.write(REPLACEMENT, 0, 3);
        i -= good;
      }
    }
    return out.toByteArray();
  }
}
