// A benchmark producer on Kafka's own Java client, for stratalog.bench.java_producer.
//
// Why Java: librdkafka (confluent-kafka) sends one partition per Produce request, while Kafka's
// Java client puts every ready partition bound for a broker into one request. KerA's experiment
// (workload d, many streams per client) is about what a broker does with such requests.
//
// Protocol with the Python side, one line each:
//   stdin:  "GO" starts the clock (sent when every load process is ready), "STOP" ends early.
//   stdout: "READY" once connected and the topics' metadata is known; "P <acked>" about every
//           200 ms; last "R <json>" with the counts, times and sampled publish latencies (us).
// Values carry their send time as the Python producers' do: the first 8 bytes are the wall
// clock in microseconds, little-endian; the rest is random bytes made once.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.management.ManagementFactory;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.time.Instant;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.Random;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.producer.Callback;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class LoadProducer {
    private static final AtomicLong acked = new AtomicLong();
    private static final AtomicLong failed = new AtomicLong();
    private static final AtomicReference<String> firstError = new AtomicReference<>("");
    private static volatile boolean stop;

    private static long nowMicros() {
        Instant t = Instant.now();
        return t.getEpochSecond() * 1_000_000L + t.getNano() / 1_000;
    }

    private static double wallSeconds() {
        return System.currentTimeMillis() / 1000.0;
    }

    private static void onError(Exception e) {
        failed.incrementAndGet();
        firstError.compareAndSet("", e.toString());
    }

    public static void main(String[] args) throws Exception {
        Map<String, String> o = new HashMap<>();
        Properties conf = new Properties();
        for (String a : args) {
            int eq = a.indexOf('=');
            String k = a.substring(0, eq), v = a.substring(eq + 1);
            if (k.startsWith("producer.")) {
                conf.put(k.substring("producer.".length()), v);
            } else {
                o.put(k, v);
            }
        }
        String[] topics = o.get("topics").split(",");
        int size = Integer.parseInt(o.get("record_size"));
        long n = Long.parseLong(o.get("records"));
        double rate = Double.parseDouble(o.get("rate"));
        int sample = Math.max(1, Integer.parseInt(o.get("sample_every")));
        double maxSeconds = Double.parseDouble(o.get("max_duration_s"));

        KafkaProducer<byte[], byte[]> producer =
                new KafkaProducer<>(conf, new ByteArraySerializer(), new ByteArraySerializer());
        for (String t : topics) {
            producer.partitionsFor(t); // metadata before the clock starts
        }
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        CountDownLatch go = new CountDownLatch(1);
        Thread control = new Thread(() -> {
            try {
                String line;
                while ((line = in.readLine()) != null) {
                    if (line.equals("GO")) {
                        go.countDown();
                    } else if (line.equals("STOP")) {
                        stop = true;
                        go.countDown();
                    }
                }
            } catch (Exception e) {
                // stdin closed: the parent is gone
            }
            stop = true;
            go.countDown();
        });
        control.setDaemon(true);
        control.start();
        System.out.println("READY");
        System.out.flush();
        go.await();

        long[] latencies = new long[(int) Math.min(Integer.MAX_VALUE - 8, n / sample + 1)];
        AtomicInteger nLatencies = new AtomicInteger();
        Callback counted = (md, e) -> {
            if (e != null) {
                onError(e);
            } else {
                acked.incrementAndGet();
            }
        };
        Thread progress = new Thread(() -> {
            while (true) {
                System.out.println("P " + (acked.get() + failed.get()));
                System.out.flush();
                try {
                    Thread.sleep(200);
                } catch (InterruptedException e) {
                    return;
                }
            }
        });
        progress.setDaemon(true);
        progress.start();

        byte[] tail = new byte[size - 8];
        new Random().nextBytes(tail);
        double tFirst = wallSeconds();
        long t0 = System.nanoTime();
        long deadline = t0 + (long) (maxSeconds * 1e9);
        boolean capped = false;
        long sent = 0;
        for (long i = 0; i < n; i++) {
            if (rate > 0) {
                long due = t0 + (long) (i / rate * 1e9);
                long wait = due - System.nanoTime();
                if (wait > 1_000_000) {
                    Thread.sleep(wait / 1_000_000);
                }
            }
            byte[] value = new byte[size];
            long sentAt = nowMicros();
            ByteBuffer.wrap(value).order(ByteOrder.LITTLE_ENDIAN).putLong(sentAt);
            System.arraycopy(tail, 0, value, 8, size - 8);
            Callback cb = counted;
            if (i % sample == 0) {
                cb = (md, e) -> {
                    if (e != null) {
                        onError(e);
                        return;
                    }
                    acked.incrementAndGet();
                    int k = nLatencies.getAndIncrement();
                    if (k < latencies.length) {
                        latencies[k] = nowMicros() - sentAt;
                    }
                };
            }
            producer.send(new ProducerRecord<>(topics[(int) (i % topics.length)], value), cb);
            sent++;
            if ((i & 511) == 0) {
                if (stop) {
                    break;
                }
                if (System.nanoTime() > deadline) {
                    capped = true;
                    break;
                }
            }
        }
        double tSent = wallSeconds();
        producer.flush();
        double tLast = wallSeconds();
        producer.close();
        progress.interrupt();

        double cpu = ((com.sun.management.OperatingSystemMXBean)
                ManagementFactory.getOperatingSystemMXBean()).getProcessCpuTime() / 1e9;
        StringBuilder out = new StringBuilder(64 + 8 * latencies.length);
        out.append("R {\"records\": ").append(acked.get())
                .append(", \"sent\": ").append(sent)
                .append(", \"errors\": ").append(failed.get())
                .append(", \"first_error\": \"")
                .append(firstError.get().replace("\\", "/").replace("\"", "'").replace('\n', ' '))
                .append("\", \"t_first\": ").append(tFirst)
                .append(", \"t_sent\": ").append(tSent)
                .append(", \"t_last\": ").append(tLast)
                .append(", \"capped\": ").append(capped)
                .append(", \"cpu_s\": ").append(cpu)
                .append(", \"latencies_us\": [");
        int m = Math.min(nLatencies.get(), latencies.length);
        for (int k = 0; k < m; k++) {
            if (k > 0) {
                out.append(',');
            }
            out.append(latencies[k]);
        }
        out.append("]}");
        System.out.println(out);
        System.out.flush();
    }
}
