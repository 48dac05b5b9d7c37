# The peers' gunicorn configuration: empty on purpose, so gunicorn does not read the service's
# ./gunicorn.conf.py (and its hooks) from the working directory. Settings come from the command line.
