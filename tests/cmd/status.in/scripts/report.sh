echo "rows: $1"
