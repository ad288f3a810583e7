#!/usr/bin/env bash
# Build the Spark source's JVM side (vibemq_server/spark/java, format("vibemq"), docs/spark.md)
# into vibemq_server/spark/jars/vibemq-spark.jar: javac and jar against the jars pyspark
# ships, no Maven, no network. Not committed: built at install/test time. Without a JDK
# (javac) it says so and exits 0: the Python source remains (vibemq_server/spark/jvm.py
# builds the same jar into a cache directory when it can, for an installed package).
# PYTHON: the interpreter with pyspark (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
javac=${JAVAC:-$( [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/javac" ] && echo "$JAVA_HOME/bin/javac" || command -v javac || true)}
if [ -z "$javac" ]; then
  echo "build_jar.sh: no javac (a JDK 17: apt install openjdk-17-jdk-headless); the JVM reader is not built" >&2
  exit 0
fi
jars=$("$py" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
src=vibemq_server/spark/java
out=vibemq_server/spark/jars
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
"$javac" --release 17 -Xlint:all -Xlint:-serial -Xlint:-processing -Xlint:-path -encoding UTF-8 -cp "$jars/*" -d "$work" $(find "$src" -name '*.java' | sort)
cp -r "$src/META-INF" "$work/"
jar=${JAR:-$(dirname "$javac")/jar}
[ -x "$jar" ] || jar=jar
"$jar" --create --file "$out/vibemq-spark.jar.tmp" -C "$work" .
mv "$out/vibemq-spark.jar.tmp" "$out/vibemq-spark.jar"
echo "built $out/vibemq-spark.jar"
