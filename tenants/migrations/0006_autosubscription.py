import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tenants', '0005_rule'),
    ]

    operations = [
        migrations.CreateModel(
            name='AutoSubscription',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('device_pattern', models.CharField(blank=True, default='', max_length=128)),
                ('filter', models.CharField(max_length=1024)),
                ('qos', models.PositiveSmallIntegerField(default=0)),
                ('no_local', models.BooleanField(default=False)),
                ('retain_as_published', models.BooleanField(default=False)),
                ('retain_handling', models.PositiveSmallIntegerField(default=0)),
                ('position', models.PositiveIntegerField(default=0)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='auto_subscriptions', to='tenants.tenant')),
            ],
            options={
                'ordering': ['tenant_id', 'position', 'id'],
            },
        ),
    ]
