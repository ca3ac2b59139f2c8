package io.kolo.spark;

/**
 * One event for kolo's driver as a single-line JSON object, e.g.
 * {@code {"kind":"executorRemoved","time":1700000000000,"executorId":"1","host":"h","reason":"..."}}.
 *
 * <p>Built with {@link #of(String)} and {@code put}; every string is JSON-escaped (control
 * characters, including newlines, become escapes), so an event never spans two lines and the
 * driver can read a drained batch line by line.
 */
public final class KoloEvent {
  /** The longest text one field keeps; longer text is cut and ends with "...". */
  public static final int MAX_FIELD_CHARS = 2048;

  private final StringBuilder json = new StringBuilder(128);

  private KoloEvent(String kind) {
    json.append('{');
    field("kind");
    quote(kind);
    put("time", System.currentTimeMillis());
  }

  /** A new event of {@code kind} stamped with the current time in epoch milliseconds. */
  public static KoloEvent of(String kind) {
    return new KoloEvent(kind);
  }

  /** Adds a string field; {@code null} is written as JSON null. */
  public KoloEvent put(String name, String value) {
    field(name);
    if (value == null) {
      json.append("null");
    } else {
      quote(value);
    }
    return this;
  }

  /** Adds a whole-number field. */
  public KoloEvent put(String name, long value) {
    field(name);
    json.append(value);
    return this;
  }

  /** Adds a boolean field. */
  public KoloEvent put(String name, boolean value) {
    field(name);
    json.append(value);
    return this;
  }

  /** The event as one line of JSON. */
  public String toJson() {
    return json + "}";
  }

  @Override
  public String toString() {
    return toJson();
  }

  private void field(String name) {
    if (json.length() > 1) {
      json.append(',');
    }
    quote(name);
    json.append(':');
  }

  private void quote(String text) {
    String value = text;
    if (value.length() > MAX_FIELD_CHARS) {
      value = value.substring(0, MAX_FIELD_CHARS - 3) + "...";
    }
    json.append('"');
    for (int i = 0; i < value.length(); i++) {
      char c = value.charAt(i);
      switch (c) {
        case '"' -> json.append("\\\"");
        case '\\' -> json.append("\\\\");
        case '\n' -> json.append("\\n");
        case '\r' -> json.append("\\r");
        case '\t' -> json.append("\\t");
        default -> {
          if (c < 0x20 || c == 0x2028 || c == 0x2029) {
            json.append(String.format("\\u%04x", (int) c));
          } else {
            json.append(c);
          }
        }
      }
    }
    json.append('"');
  }
}
