"""What a build leaves for people and tools: manifest.json, report.json/report.html, the search table."""
